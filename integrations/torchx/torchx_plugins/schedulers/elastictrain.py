"""Registers the ``elastictrain`` scheduler with TorchX (its ``torchx_plugins`` namespace)."""

from torchx.plugins import register


@register.scheduler(name="elastictrain")
def elastictrain(session_name: str, **kwargs):
    from elastictrain_torchx.scheduler import create_scheduler

    return create_scheduler(session_name, **kwargs)
