from django.db.models.signals import post_save
from django.dispatch import receiver

from projects.models import Project


@receiver(post_save, sender=Project, dispatch_uid="alerts.default_rules")
def install_default_rules(sender, instance, created, raw=False, **kwargs):
    """Every new project starts with the rules of thumb (DESIGN §6)."""
    if created and not raw:
        from .services import default_rules_install

        default_rules_install(project=instance)
