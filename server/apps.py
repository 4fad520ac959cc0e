from django.apps import AppConfig


class ServerConfig(AppConfig):
    name = "server"
    verbose_name = "Server (serve, in-process beat, orderly stop)"
