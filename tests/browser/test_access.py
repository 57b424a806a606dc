"""The test server, like the workbook's own JupyterLab scripts, refuses anyone without the token."""

from __future__ import annotations

import pytest
from labdriver import Lab, LabServer

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")


def test_server_binds_loopback_with_token(lab_server: LabServer) -> None:
    """The server answers on 127.0.0.1 and accepts its token (the positive control for the tests below)."""
    assert lab_server.base_url.startswith("http://127.0.0.1:")
    assert len(lab_server.token) >= 32
    assert lab_server.request("/lab").status == 200
    assert lab_server.request("/api/contents").status == 200


def test_anonymous_http_is_refused(lab_server: LabServer) -> None:
    """Without the token the lab page redirects to the login page and the API answers 403."""
    page = lab_server.request("/lab", with_token=False)
    assert page.status in (302, 403), f"/lab without a token answered {page.status}"
    if page.status == 302:
        assert "/login" in page.headers.get("Location", ""), page.headers
    assert lab_server.request("/api/contents", with_token=False).status == 403
    assert lab_server.request("/api/sessions", with_token=False).status == 403
    wrong = lab_server.request("/api/contents?token=not-the-token", with_token=False)
    assert wrong.status == 403


def test_anonymous_browser_lands_on_login(lab: Lab) -> None:
    """A browser without the token cookie never sees JupyterLab: it is sent to the login form."""
    page = lab.new_page()
    page.goto(f"{lab.server.base_url}/lab")
    assert "/login" in page.url, page.url
    page.locator("input[type=password]").first.wait_for(state="visible")
    assert page.evaluate("() => typeof window.jupyterapp") == "undefined"
    page.context.close()
    lab.pages.remove(page)
