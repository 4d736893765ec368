"""The web console at /ui: what the agents remember, and why, for the people who run the fleet.

Server-rendered pages (Jinja2, autoescaped) over the same reader and stores the
HTTP API reads, in the same process (`pvm serve`, `--no-ui` to leave it out).
Changes made from the console (assert, retract or promote a fact, learn a key)
call the API's own route handlers, so each is a minute in the log like any
other change. Scripts, styles and fonts are PVM's own, served from
`workers/console/static`: the console works offline.

Tokens as in the API: with tokens configured the console asks for one at
/ui/login, keeps it in an HttpOnly, SameSite=Strict cookie scoped to /ui (never
in a URL), and shows only the projects it grants.
"""
