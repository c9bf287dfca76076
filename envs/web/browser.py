"""The browser side: fetch shop pages over HTTP, render them to text, follow clicks and searches.

A page is rendered WebShop-style: text in reading order, every link and button as ``[label]``.
``click[label]`` follows a link or submits a button's form; ``search[keywords]`` submits the page's
search box. Anything else is an invalid action: the page stays, the observation says why, and
``invalid_actions`` counts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import httpx

from agentrl.envs.web.manager import ShopServer
from agentrl.errors import EnvError
from agentrl.tools.base import ToolResult

MAX_KEYWORDS = 500
RESTART_NOTICE = (
    "The shop server restarted; your session was reset to the search page. Start again from the search box."
)
_BLOCK_TAGS = frozenset(
    {"div", "p", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "br", "form", "tr", "body"}
)


def normalize_label(text: str) -> str:
    """How labels are compared: lower case, single spaces, no surrounding brackets or quotes."""
    text = " ".join(text.split()).lower()
    while len(text) >= 2 and (text[0], text[-1]) in {("[", "]"), ('"', '"'), ("'", "'")}:
        text = text[1:-1].strip()
    return text


@dataclass
class Form:
    method: str
    action: str
    fields: dict[str, str] = field(default_factory=dict)
    text_input: str | None = None  # name of the text box (a search form)


@dataclass
class Clickable:
    label: str
    href: str | None = None  # a link
    form: Form | None = None  # a submit button


@dataclass
class Page:
    text: str
    clickables: list[Clickable]
    search_form: Form | None
    purchase: dict[str, Any] | None
    done: bool = False

    def find(self, element: str) -> Clickable | None:
        wanted = normalize_label(element)
        return next((c for c in self.clickables if normalize_label(c.label) == wanted), None)

    def labels(self) -> list[str]:
        return [c.label for c in self.clickables]


class PageParser(HTMLParser):
    """HTML -> (text, clickables, search form, purchase JSON). Entities are unescaped, so markup
    typed by the user shows up as literal text, never as elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.clickables: list[Clickable] = []
        self.search_form: Form | None = None
        self.purchase: dict[str, Any] | None = None
        self._form: Form | None = None
        self._label: list[str] | None = None
        self._href: str | None = None
        self._in_button = False
        self._skip: str | None = None  # inside <script>/<style>/<title>
        self._script_json: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in ("script", "style", "title", "head"):
            self._skip = tag
            if tag == "script" and a.get("id") == "purchase":
                self._script_json = []
            return
        if tag in _BLOCK_TAGS:
            self.out.append("\n")
        if tag == "form":
            self._form = Form(method=a.get("method", "get").lower(), action=a.get("action", ""))
        elif tag == "input" and self._form is not None:
            kind = a.get("type", "text").lower()
            if kind == "hidden":
                self._form.fields[a.get("name", "")] = a.get("value", "")
            elif kind == "text":
                self._form.text_input = a.get("name", "q")
                self.search_form = self._form
        elif tag == "a":
            self._label, self._href = [], a.get("href", "")
        elif tag == "button":
            self._label, self._in_button = [], True

    def handle_endtag(self, tag: str) -> None:
        if self._skip == tag:
            if self._script_json is not None:
                self.purchase = json.loads("".join(self._script_json))
                self._script_json = None
            self._skip = None
            return
        if tag == "a" and self._label is not None:
            label = " ".join("".join(self._label).split())
            self.clickables.append(Clickable(label=label, href=self._href))
            self.out.append(f"[{label}]")
            self._label = None
        elif tag == "button" and self._label is not None:
            label = " ".join("".join(self._label).split())
            self.clickables.append(Clickable(label=label, form=self._form))
            self.out.append(f"[{label}]")
            self._label, self._in_button = None, False
        elif tag == "form":
            self._form = None
        if tag in _BLOCK_TAGS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if self._skip:
            if self._script_json is not None:
                self._script_json.append(data)
            return
        if self._label is not None:
            self._label.append(data)
        else:
            self.out.append(data)

    def page(self) -> Page:
        lines = (" ".join(line.split()) for line in "".join(self.out).split("\n"))
        text = "\n".join(line for line in lines if line)
        return Page(
            text=text, clickables=self.clickables, search_form=self.search_form, purchase=self.purchase
        )


def _repoint(page: Page, old: str, new: str) -> Page:
    """A deep copy of ``page`` whose links and forms point at session path ``new`` instead of ``old``."""
    import copy

    def move(url: str | None) -> str | None:
        return new + url[len(old) :] if url is not None and url.startswith(old) else url

    page = copy.deepcopy(page)
    forms = {id(c.form): c.form for c in page.clickables if c.form is not None}
    if page.search_form is not None:
        forms[id(page.search_form)] = page.search_form
    for form in forms.values():
        form.action = move(form.action) or ""
    for clickable in page.clickables:
        clickable.href = move(clickable.href)
    return page


def parse_page(html_text: str) -> Page:
    parser = PageParser()
    parser.feed(html_text)
    parser.close()
    return parser.page()


class Browser:
    """One episode's view of the shop: a session, the current page, counters."""

    def __init__(self, server: ShopServer, client: httpx.Client):
        self.server = server
        self.client = client
        self.session_id: str | None = None
        self.page: Page | None = None
        self.generation = server.generation
        self.invalid_actions = 0
        self.server_restarts = 0
        self.purchase: dict[str, Any] | None = None  # what Buy Now bought in this episode
        self._instruction = ""
        self._goal: dict[str, Any] | None = None

    # ------------------------------------------------------------------ sessions
    def open(self, instruction: str, goal: dict[str, Any] | None = None) -> str:
        """Start a session and return the search page's text."""
        self.close()
        self._instruction, self._goal = instruction, goal
        self.invalid_actions = self.server_restarts = 0
        self.purchase = None
        page = self._new_session()
        if isinstance(page, str):  # the server had to be restarted on the way
            return page
        return page.text

    def _new_session(self) -> Page | str:
        try:
            created = self.client.post(
                f"{self.server.url}/api/sessions", json={"instruction": self._instruction, "goal": self._goal}
            )
            created.raise_for_status()
            self.session_id = created.json()["session_id"]
            response = self.client.get(f"{self.server.url}/s/{self.session_id}")
        except httpx.TransportError:
            return self._recover()
        self.generation = self.server.generation
        self.page = parse_page(response.text)
        return self.page

    def fork(self, client: httpx.Client, server: ShopServer | None = None) -> Browser:
        """A browser on a copy of this session (``POST /api/sessions/{sid}/fork`` on the server) and
        of this page (its links re-pointed at the new session), with the same counters.

        Raises:
            EnvError: no session to fork, or the server cannot fork one (an older shop server).
        """
        if self.session_id is None or self.page is None:
            raise EnvError("the browser has no session to fork: open() one first")
        server = server or self.server
        try:
            response = client.post(f"{server.url}/api/sessions/{self.session_id}/fork")
        except httpx.TransportError as exc:
            raise EnvError(f"the shop server did not answer the fork of session {self.session_id}: {exc}") from exc
        if response.status_code != 200:
            raise EnvError(f"the shop server could not fork session {self.session_id} (HTTP {response.status_code}; "
                           f"a server without POST /api/sessions/{{sid}}/fork is too old to fork)")  # fmt: skip
        sid = response.json()["session_id"]
        child = Browser(server, client)
        child.session_id = sid
        child.page = _repoint(self.page, f"/s/{self.session_id}", f"/s/{sid}")
        child.generation = self.generation
        child.invalid_actions, child.server_restarts = self.invalid_actions, self.server_restarts
        child.purchase = dict(self.purchase) if self.purchase is not None else None
        child._instruction, child._goal = self._instruction, self._goal
        return child

    def close(self) -> None:
        """Delete the session on the server (best effort: a dead server has no sessions)."""
        sid, self.session_id = self.session_id, None
        self.page = None
        if sid is None or not self.server.url:
            return
        try:
            self.client.delete(f"{self.server.url}/api/sessions/{sid}")
        except httpx.TransportError:
            pass

    def _recover(self) -> str:
        """The server died or forgot us: make sure it runs, open a new session, tell the model."""
        self.server.ensure_running(self.generation)
        self.server_restarts += 1
        if self.server_restarts > 3:
            raise EnvError("the shop server keeps failing: restarted 3 times in one episode")
        page = self._new_session()
        if isinstance(page, str):
            return page
        return f"{RESTART_NOTICE}\n\n{page.text}"

    def _fetch(self, method: str, path: str, data: dict[str, str] | None = None) -> Page | str:
        try:
            response = self.client.request(method, f"{self.server.url}{path}", data=data)
        except httpx.TransportError:
            return self._recover()
        if response.status_code == 404 and response.headers.get("x-shop-error") == "unknown-session":
            return self._recover()
        page = parse_page(response.text)
        page.done = response.headers.get("x-shop-done") == "1"
        self.page = page
        return page

    # ------------------------------------------------------------------ actions
    def _invalid(self, why: str) -> str:
        self.invalid_actions += 1
        labels = ", ".join(f"[{label}]" for label in (self.page.labels() if self.page else []))
        search = " You can also use search[keywords] here." if self.page and self.page.search_form else ""
        return (
            f"Invalid action: {why} The page did not change. Clickable here: {labels or 'nothing'}.{search}"
        )

    def _result(self, page: Page | str) -> ToolResult:
        if isinstance(page, str):
            return ToolResult(page)
        if page.done and page.purchase is not None:
            self.purchase = page.purchase
            return ToolResult(page.text, done=True, answer=json.dumps(page.purchase, sort_keys=True))
        return ToolResult(page.text)

    def search(self, keywords: str) -> ToolResult:
        if self.page is None:
            raise EnvError("the browser has no page: call open() first")
        if self.page.search_form is None:
            return ToolResult(
                self._invalid("there is no search box on this page; click [Back to Search] first.")
            )
        keywords = " ".join(keywords.split())
        if not keywords:
            return ToolResult(self._invalid("search needs keywords, e.g. search[red running shoes]."))
        if len(keywords) > MAX_KEYWORDS:
            return ToolResult(
                self._invalid(f"the keywords are {len(keywords)} characters; the limit is {MAX_KEYWORDS}.")
            )
        form = self.page.search_form
        params = {**form.fields, form.text_input or "q": keywords}
        page = self._fetch("GET", form.action + "?" + str(httpx.QueryParams(params)))
        return self._result(page)

    def click(self, element: str) -> ToolResult:
        if self.page is None:
            raise EnvError("the browser has no page: call open() first")
        target = self.page.find(element)
        if target is None:
            shown = element if len(element) <= 80 else element[:80] + "..."
            return ToolResult(self._invalid(f"{shown!r} is not a clickable element on this page."))
        if target.href is not None:
            return self._result(self._fetch("GET", target.href))
        form = target.form
        if form is None:
            return ToolResult(self._invalid(f"[{target.label}] does nothing."))
        if form.text_input is not None:
            return ToolResult(
                self._invalid("to search, write search[your keywords] instead of clicking the button.")
            )
        if form.method == "post":
            return self._result(self._fetch("POST", form.action, data=dict(form.fields)))
        return self._result(self._fetch("GET", form.action + "?" + str(httpx.QueryParams(form.fields))))
