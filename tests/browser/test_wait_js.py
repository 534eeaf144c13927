"""``wait_js``, the browser tests' wait for the page, works under the console's real policy.

The console refuses eval (``llmgw_core/security.py``), so Playwright's
``page.wait_for_function`` cannot run there; the tests wait with ``wait_js`` instead.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Error

from llmgw_core.security import CONTENT_SECURITY_POLICY
from tests.browser.conftest import wait_js

pytestmark = pytest.mark.django_db(transaction=True)

# Added before the page's own scripts, as a recorder would be.
RECORDER = "window.__added = (window.__added || 0) + 1;"


def test_wait_js_waits_for_the_page_under_its_policy(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    page = signed_in(operator)
    page.context.add_init_script(RECORDER)
    response = page.goto(f"{live_server.url}/catalog/")
    # The page is served with the real policy, and the page's own code cannot eval.
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    page.evaluate(
        """() => setTimeout(() => {
          try { eval("1"); window.__eval = "ran"; } catch (e) { window.__eval = e.name; }
        }, 0)"""
    )
    assert wait_js(page, "window.__eval", what="the page's own eval to be tried") == "EvalError"

    # A condition true only later, after the page's own tasks and an observed change.
    page.evaluate(
        """() => {
          window.__seen = [];
          new MutationObserver(() => window.__seen.push(document.title))
            .observe(document.head, {childList: true, subtree: true, characterData: true});
          setTimeout(() => { document.title = "changed"; }, 300);
        }"""
    )
    assert wait_js(page, "window.__seen.includes('changed')", what="the title's change")
    # An argument is passed; a function's answer is what it returns.
    assert wait_js(page, "(n) => window.__added === n && n", 1, what="the init script") == 1

    # Never true: it fails at its deadline, naming what it waited for and the last answer.
    with pytest.raises(AssertionError, match=r"waiting for the impossible \(last: False\)"):
        wait_js(page, "1 === 2", timeout=0.5, what="the impossible")
    # A predicate that throws fails at once, as wait_for_function's did.
    with pytest.raises(Error, match="no_such_name"):
        wait_js(page, "no_such_name.length", what="a broken predicate")
