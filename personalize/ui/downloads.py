"""The page's files (StudioConfig.page_files, Gradio's cache: uploads and the copies of downloads): a download is
handed out from its login's own folder there, the file route serves that folder to that login only, and the whole
page folder is emptied when the server stops.

Gradio's file route (`/gradio_api/file=PATH`) checks that someone is logged in, not who: any login's cookie fetched
any file of the cache. `hand_out` puts a download in `downloads/<the login's folder>/<random>/` of the page folder
(Gradio serves a file already in its cache where it is, without copying it), and `OwnDownloads`, a middleware of the
server (app.launch_options), answers 403 to a request for a file of another login's folder there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from pathlib import Path

from personalize.schema import current_login

DOWNLOADS = "downloads"  # the page folder's sub-folder of handed-out files, one folder per login inside
_FILE_ROUTE = re.compile(r"/file(=|/)(.*)$")  # /gradio_api/file=PATH, and Gradio's older /file/PATH


def owner_folder(login: str | None) -> str:
    """The folder of a login's downloads (a hash: any login name makes one safe folder name); without logins, one."""
    return "anyone" if login is None else hashlib.sha256(login.encode()).hexdigest()[:32]


def hand_out(page_files: Path, *paths: str | Path) -> list[str]:
    """Copies of `paths` in the current login's download folder, to give to the page: only that login fetches them."""
    out, mine = [], Path(page_files).resolve() / DOWNLOADS / owner_folder(current_login())
    for path in paths:
        copy = mine / uuid.uuid4().hex / Path(path).name
        copy.parent.mkdir(parents=True)
        shutil.copyfile(path, copy)
        out.append(str(copy))
    return out


def may_fetch(page_files: Path, path: str, login: str | None) -> bool:
    """Whether `login` may fetch `path` (as the file route reads it, relative to the working folder): a handed-out
    file only from its own login's folder; any other path is left to Gradio's own rules."""
    downloads = Path(page_files).resolve() / DOWNLOADS
    try:
        parts = Path(os.path.abspath(path)).resolve().relative_to(downloads).parts
    except (ValueError, OSError):
        return True  # not a download (Gradio's rules: the page folder only, the database never)
    return bool(parts) and parts[0] == owner_folder(login)


def login_of(scope) -> str | None:
    """The login of a request to Gradio's server (its session cookie, as Gradio's own check reads it)."""
    from starlette.requests import Request

    app = scope.get("app")
    if getattr(app, "auth", None) is None:
        return None  # no logins: one person at this machine
    cookies = Request(scope).cookies
    token = cookies.get(f"access-token-{app.cookie_id}") or cookies.get(f"access-token-unsecure-{app.cookie_id}")
    return app.tokens.get(token) or ""  # "": not logged in, which owns no download


class OwnDownloads:
    """ASGI middleware of the studio's server: the file route answers 403 for a download of another login."""

    def __init__(self, app, page_files: Path):
        self.app, self.page_files = app, Path(page_files)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (m := _FILE_ROUTE.search(scope["path"])):
            if not may_fetch(self.page_files, m.group(2), login_of(scope)):
                from starlette.responses import PlainTextResponse

                return await PlainTextResponse("File not allowed.", status_code=403)(scope, receive, send)
        await self.app(scope, receive, send)


def empty(page_files: Path) -> None:
    """Removes everything in the page folder (the server stops: no upload or download outlives it)."""
    folder = Path(page_files)
    for f in folder.iterdir() if folder.is_dir() else ():
        shutil.rmtree(f, ignore_errors=True) if f.is_dir() and not f.is_symlink() else f.unlink(missing_ok=True)
