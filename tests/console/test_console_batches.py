"""A tenant's batches on its console page: each with its status, progress and times, the
newest first; an operator cancels one with the console's CSRF protection, as the tenant's
own cancel does, audited; one that finished, or another tenant's, is refused next to the
form and audited so."""

from __future__ import annotations

import html

from tests.support.batches import FAST_BATCHES, FINAL, chat_line, finished, submitted
from tests.support.console import UI, console
from tests.support.responses import client
from tests.support.scripted_engine import ScriptedEngine
from tests.support.serving import TENANT, ServeFactory

CANCEL_BUTTON = "Cancel <span"


async def test_an_operator_sees_a_tenants_batches_and_cancels_one(serve: ServeFactory) -> None:
    async with (
        serve(ScriptedEngine(step_seconds=0.05), batch_concurrency=1, **FAST_BATCHES) as served,
        console(served.base_url) as ui,
    ):
        api = client(served)
        done = await finished(
            api, (await submitted(api, [chat_line("a", served.model, max_tokens=2)])).id
        )
        assert done.status == "completed"
        long = [chat_line(f"long-{i}", served.model, max_tokens=100_000) for i in range(3)]
        running = await finished(api, (await submitted(api, long)).id, frozenset({"in_progress"}))

        page = html.unescape((await ui.get(f"/tenants/{TENANT}")).text)
        assert page.index(running.id) < page.index(done.id), "newest first"
        running_row = page[page.index(running.id) : page.index(done.id)]
        assert "in_progress" in running_row and "/ 0 / 3" in running_row
        assert CANCEL_BUTTON in running_row
        done_row = page[page.index(done.id) : page.index("</tr>", page.index(done.id))]
        assert "completed" in done_row and "1 / 0 / 1" in done_row
        assert CANCEL_BUTTON not in done_row, "a finished batch has nothing to cancel"

        cancel = f"/tenants/{TENANT}/batches/{running.id}/cancel"
        forged = await ui.client.post(UI + cancel, data={})
        assert forged.status_code == 403
        assert (await api.batches.retrieve(running.id)).status == "in_progress"

        answer = await ui.post(cancel)
        assert answer.status_code == 303
        cancelled = await finished(api, running.id, FINAL)
        assert cancelled.status == "cancelled" and cancelled.error_file_id is not None

        refused = await ui.post(f"/tenants/{TENANT}/batches/{done.id}/cancel")
        assert refused.status_code == 400 and 'id="batches-error"' in refused.text
        assert "cannot be cancelled" in refused.text
        await served.admin("POST", "/tenants", {"id": "other", "name": "O"})
        elsewhere = await ui.post(f"/tenants/other/batches/{done.id}/cancel")
        assert elsewhere.status_code == 404, "another tenant's batch is not found"

        audit = (await served.admin("GET", "/audit?limit=50"))["data"]
        cancels = [(r["target"], r["outcome"]) for r in audit if r["action"] == "batch.cancel"]
        assert sorted(cancels) == sorted(
            [
                (f"{TENANT}/{running.id}", "ok"),
                ("console", "rejected"),
                ("console", "rejected"),
            ]
        )
