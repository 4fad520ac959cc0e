from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dashboard.views import healthz

# A metadata database outage answers a clear 503 instead of a bare 500 (config/errors.py).
handler404 = "config.errors.page_not_found"
handler500 = "config.errors.server_error"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("ingest.urls")),
    path("alerts/", include("alerts.urls")),
    path("settings/", include("projects.urls")),
    path("", include("loadtests.urls")),
    path("", include("dashboard.urls")),
]
