from django.urls import path

from . import views

app_name = "loadtests"
urlpatterns = [
    path("loadtests/", views.load_test_list, name="list"),
    path("loadtests/start/", views.load_test_start_view, name="start"),
    path("loadtests/<int:pk>/", views.load_test_detail, name="detail"),
    path("loadtests/<int:pk>/progress.json", views.load_test_progress, name="progress"),
    path("loadtests/<int:pk>/report.json", views.load_test_report_json, name="report_json"),
]
