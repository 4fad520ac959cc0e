from django.urls import path

from . import views

app_name = "ingest"
urlpatterns = [path("api/v1/traces", views.traces_ingest, name="traces")]
