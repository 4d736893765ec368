"""The console's context preview: the context an agent would get now, built as the API's context route builds it,
with what the budget kept of each section, what it left out and why, and the prompt-ready text.

`ContextReader.build_context` is the agent's own read: a preview counts as one (the access counts of the
experience it shows and the read counts of the facts it keeps move, as for the agent). Without an agent id the
page is the form alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.routing import Route

from contracts.errors import InvalidFact
from contracts.facts import check_task_id
from contracts.memory import ContextPackage
from pvm import defaults
from workers.api import fields
from workers.api.app import thread_param
from workers.api.request import BadRequest, list_param
from workers.console.site import Page, Site, Visit

# Why a section may leave items out, beyond what the sections before it left of the budget (`build_context`).
SECTION_LIMITS = {
    "rules": f"at most {defaults.CONTEXT_RULE_SHARE:.0%} of the budget",
    "facts": f"at most {defaults.CONTEXT_FACT_SHARE:.0%} of the budget, split between the task, project and global "
    "tiers (PVM_FACT_TIER_SPLIT)",
    "summaries": "a share of what agent memory, rules and facts leave (PVM_CONTEXT_RETRIEVED_SHARE) and what the "
    "thread's newest minutes left of theirs; older chunks by their decisions alone when not all fit",
    "episodes": "what the summaries left of their share",
}
# A thread's newest minutes stand for the project's, within their own share.
THREAD_RECENT_LIMIT = "a share of what agent memory, rules and facts leave (PVM_CONTEXT_RECENT_SHARE)"


@dataclass(frozen=True)
class SectionRow:
    """One section of a context as the budget left it: items kept, tokens spent, items left out and why."""

    name: str
    kept: int
    tokens: int
    cut: int
    limit: str  # '' when the section may take whatever the sections before it left


def section_rows(package: ContextPackage) -> list[SectionRow]:
    """Every section of the budget report, in the order the budget filled them (most important first)."""
    budget = package.budget
    kept = {
        "agent_memory": 1 if budget.sections.get("agent_memory") else 0,
        "rules": len(package.rules),
        "facts": len(package.facts),
        "recent": len(package.recent),
        "summaries": len(package.summaries),
        "episodes": len(package.episodes),
        "relevant_experience": len(package.relevant_experience),
        "referenced": len(package.referenced),
    }
    limits = dict(SECTION_LIMITS, recent=THREAD_RECENT_LIMIT) if package.thread else SECTION_LIMITS
    # The report's sections keep the order the budget filled them in; a section is cut only if it is there.
    names = [*budget.sections, *(s for s in budget.cut if s not in budget.sections)]
    return [
        SectionRow(name, kept.get(name, 0), budget.sections.get(name, 0), budget.cut.get(name, 0), limits.get(name, ""))
        for name in names
    ]


def index_note(package: ContextPackage) -> list[tuple[str, str]]:
    """What the search behind the relevant experience said about itself: (css class, sentence) pairs."""
    index = package.freshness.get("index", {}) if isinstance(package.freshness, dict) else {}
    notes = []
    if index.get("behind"):
        notes.append(("warn", f"search is {index['behind']} minutes behind the log: the newest are not searchable yet"))
    if index.get("error"):
        notes.append(("bad", f"relevant experience is missing: the search failed ({index['error']})"))
    elif index.get("degraded"):
        notes.append(("warn", f"relevant experience matched by keywords only: {index['degraded']}"))
    return notes


def form_values(visit: Visit) -> dict[str, str]:
    """The form's fields as sent (empty when left out), to show them again."""
    names = ("agent_id", "task", "task_id", "thread", "budget_tokens")
    values = {name: visit.param(name) for name in names}
    values["tag"] = ", ".join(list_param(visit.request, "tag"))
    return values


def context_page(visit: Visit) -> Page:
    """The form, and with an agent id the context that agent would get now."""
    request = visit.request
    form = form_values(visit)
    values: dict[str, Any] = {
        "form": form,
        "package": None,
        "default_budget": defaults.CONTEXT_BUDGET_TOKENS,
        "budget_max": fields.CONTEXT_BUDGET_MAX,
        "global": visit.scope.allows_global,
    }
    # Checked before the agent id, so a bad value is named even on a form sent without one.
    budget = fields.BUDGET_TOKENS.integer(request)
    task_id = form["task_id"] or None
    if task_id is not None:
        try:
            check_task_id(task_id)
        except InvalidFact as exc:
            raise BadRequest(f"query parameter task_id: {exc.problem}") from None
    thread = thread_param(request, form["thread"])
    if not form["agent_id"]:
        return Page("context.html", "Context preview", values)
    package = visit.stores.reader.build_context(
        visit.project_id,
        form["agent_id"],
        task=form["task"] or None,
        budget_tokens=budget,
        task_id=task_id,
        tags=list_param(request, "tag"),
        include_global=visit.scope.allows_global,  # the global tier only with the grant, as the API
        thread=None if thread is None else str(thread),
    )
    tiers = sorted({*package.budget.tiers, *package.budget.tier_cut})
    values.update(
        package=package,
        sections=section_rows(package),
        tiers=[(t, package.budget.tiers.get(t, 0), package.budget.tier_cut.get(t, 0)) for t in tiers],
        notes=index_note(package),
        text=package.render(),
    )
    return Page("context.html", f"Context for {form['agent_id']}", values)


def routes(site: Site) -> list[Route]:
    return [Route("/ui/projects/{project_id}/context", site.page(context_page))]
