"""The OpenAI Agents SDK (``openai-agents``) on the real engine, as a tenant runs it: its
default model (the Responses API's) with the tenant's key, an agent on the tenant's adapter
with one function tool. Turn 1 is forced to the tool by name; the tool runs once; the next
request carries its output; the run ends with a text message (the model's words are not
judged)."""

from __future__ import annotations

from typing import Literal

import pytest

from tests.support.live_gateway import LiveGateway

pytestmark = pytest.mark.slow

TENANT, ADAPTER = "acme-legal", "legal_advisor"


def test_an_agent_calls_its_tool_once_then_answers(gateway: LiveGateway) -> None:
    # Imported here, not at the module's top: every test process collects this module, the
    # fast layer's workers too, where the SDK's import (~0.7 s of CPU each) serves nothing.
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
    from agents.models.openai_provider import OpenAIProvider

    cities: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "London", "Rome"]) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"18 degrees and sunny in {city}"

    agent = Agent(
        name="Assistant",
        instructions="Answer in one short sentence.",
        model=ADAPTER,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=160),
    )
    client = gateway.async_client(TENANT)
    config = RunConfig(
        model_provider=OpenAIProvider(openai_client=client, use_responses=True),
        tracing_disabled=True,
    )
    result = gateway.run(
        Runner.run(agent, "What is the weather in Paris?", run_config=config, max_turns=3)
    )

    assert len(cities) == 1
    first, second = result.raw_responses
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    # The run ended with a text message, and with no further call.
    assert [item.type for item in second.output] == ["message"]
    assert isinstance(result.final_output, str) and result.final_output
    assert result.final_output == second.output[0].content[0].text  # type: ignore[union-attr]

    # Turn 1 was forced to the tool by name; the second, after the call, was not.
    assert first.response_id is not None and second.response_id is not None
    stored = gateway.client(TENANT).responses
    asked = [stored.retrieve(response.response_id).tool_choice for response in (first, second)]
    assert asked[0].type == "function" and asked[0].name == "get_weather"  # type: ignore[union-attr]
    assert asked[1] == "auto"

    # The second request carried the tool's output for the first one's call: what the gateway
    # stored of its input (the SDK sends the whole history, and stores by default).
    listed = stored.input_items.list(second.response_id, order="asc")
    outputs = [item for item in listed.data if item.type == "function_call_output"]
    assert [(item.call_id, item.output) for item in outputs] == [  # type: ignore[union-attr]
        (call.call_id, f"18 degrees and sunny in {cities[0]}")
    ]
