from django.urls import path
from django.views.generic import RedirectView

from . import views

app_name = "dashboard"
urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:traces", query_string=True), name="home"),
    path("traces/", views.traces_list, name="traces"),
    path("resources/", views.resources_latest, name="resources"),
]
