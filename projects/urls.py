"""The settings page's forms (mounted under ``/settings/``; the page itself is ``dashboard:settings``)."""

from django.urls import path

from . import views

app_name = "projects"
urlpatterns = [
    path("keys/new/", views.key_create, name="key_create"),
    path("keys/<int:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("members/new/", views.member_add, name="member_add"),
    path("members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path("projects/new/", views.project_create, name="project_create"),
    path("index-keys/new/", views.index_key_add, name="index_key_add"),
    path("index-keys/remove/", views.index_key_remove, name="index_key_remove"),
]
