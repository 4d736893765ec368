"""The console's login and logout: a token typed into a form, kept in an HttpOnly cookie scoped to /ui.

The token never appears in a URL: the form posts it, the answer sets the
cookie and redirects. Each later request is checked again by the API's own
auth (a token revoked in the tokens file stops working at once). Without tokens
configured the console is open, as the API is, and /ui/login says so.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from workers.console.site import LOGIN_PATH, TOKEN_COOKIE, UI_PATH, Page, Site, same_origin


def _next_path(raw: str | None) -> str:
    """Where to go after logging in: a console path only (never another site)."""
    path = urllib.parse.urlsplit(raw or "").path
    return path if path == UI_PATH or path.startswith(UI_PATH + "/") else UI_PATH


def routes(site: Site) -> list[Route]:
    check_token = site.stores.check_token

    def form(request: Request, status: int = 200, problem: str = "") -> Response:
        next_path = _next_path(request.query_params.get("next"))
        page = Page("login.html", "Sign in", {"problem": problem, "next_path": next_path}, status=status)
        return site.render(request, page, None)

    async def show(request: Request) -> Response:
        if not site.guarded:
            return RedirectResponse(UI_PATH, status_code=303)
        return form(request)

    async def sign_in(request: Request) -> Response:
        if not same_origin(request):
            return site.error(request, 403, "Refused", "sign in from the console's own login page")
        fields = dict(urllib.parse.parse_qsl((await request.body()).decode("utf-8", "replace")))
        token = fields.get("token", "").strip()
        if not token or check_token(token) is None:
            return form(request, 401, "That token was not accepted: paste the whole token (pvm token new prints it).")
        answer = RedirectResponse(_next_path(fields.get("next")), status_code=303)
        answer.set_cookie(
            TOKEN_COOKIE,
            token,
            path=UI_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def sign_out(request: Request) -> Response:
        if not same_origin(request):
            return site.error(request, 403, "Refused", "sign out from the console's own pages")
        answer = RedirectResponse(LOGIN_PATH if site.guarded else UI_PATH, status_code=303)
        answer.delete_cookie(TOKEN_COOKIE, path=UI_PATH)
        return answer

    return [
        Route(LOGIN_PATH, show, methods=["GET"]),
        Route(LOGIN_PATH, sign_in, methods=["POST"]),
        Route(f"{UI_PATH}/logout", sign_out, methods=["POST"]),
    ]
