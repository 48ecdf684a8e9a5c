"""Template context for every page: the last failed config reload, the LLM budgets reached today and the
models failing now (shown as banners in the admin; the last two are read only when a page shows them)."""

from django.http import HttpRequest

from console.model_health import failing_models
from core import reload
from core.config import format_shown, get_config


def config_reload(request: HttpRequest) -> dict:
    return {"config_reload_error": reload.last_error}


def _budgets_reached() -> list[str]:
    from chat.agent.budget import budget_states

    cfg = get_config()
    if not cfg.llm.budgets:
        return []
    return [
        f"{s.cap.label} ({s.cap.limits()}): calls under it wait until {format_shown(s.resets, cfg.tzinfo)}"
        for s in budget_states(cfg, only_reached=True)
    ]


def llm_budgets(request: HttpRequest) -> dict:
    # A callable: the template calls it only where the banner is rendered (staff pages).
    return {"llm_budgets_reached": _budgets_reached, "llm_models_failing": failing_models}
