from django.urls import path

from . import views

app_name = "alerts"
urlpatterns = [
    path("", views.alerts_page, name="index"),
    path("rules/new/", views.rule_edit, name="rule_new"),
    path("rules/<int:rule_id>/", views.rule_edit, name="rule_edit"),
    path("rules/<int:rule_id>/delete/", views.rule_delete, name="rule_delete"),
    path("channels/new/", views.channel_new, name="channel_new"),
    path("channels/<int:channel_id>/delete/", views.channel_delete, name="channel_delete"),
    path("channels/<int:channel_id>/test/", views.channel_test, name="channel_test"),
    path("silences/new/", views.silence_new, name="silence_new"),
    path("silences/<int:silence_id>/expire/", views.silence_expire, name="silence_expire"),
    path("series/<int:series_id>/ack/", views.series_ack, name="series_ack"),
    path("firing.json", views.firing_json, name="firing_json"),
]
