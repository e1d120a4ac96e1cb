"""Every operation of ``/openapi.json``, fuzzed with valid and invalid input and valid
credentials: no response is a server error, and every error is OpenAI-shaped."""

from __future__ import annotations

from schemathesis import Case

from tests.fuzz.checks import openai_error_problem, openai_shaped_error
from tests.fuzz.schema import load_schema
from tests.support.fuzz_target import TALLY, FuzzTarget

schema = load_schema()


@schema.parametrize()
def test_operation(case: Case, fuzz_target: FuzzTarget) -> None:
    response = case.call(
        base_url=fuzz_target.base_url, headers=fuzz_target.auth(case.path), timeout=30
    )
    content_type = response.headers.get("content-type", [""])[0]
    problem = openai_error_problem(response.status_code, response.content, content_type)
    operation = f"{case.method.upper()} {case.path}"
    TALLY.count(operation, response.status_code, problem is not None, content_type)
    try:
        case.validate_response(
            response,
            additional_checks=[openai_shaped_error],
            transport_kwargs={"base_url": fuzz_target.base_url},
        )
    except Exception:
        TALLY.failed_cases += 1
        raise
    finally:
        # What an accepted admin write changed is put back; a refused one changed nothing, as
        # the admin API validates before it writes, in one transaction.
        if case.method != "GET" and case.path.startswith("/admin/") and response.status_code < 300:
            fuzz_target.seeds.restore()
