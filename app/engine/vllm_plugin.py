"""vLLM general plugin: loaded by vLLM in every process it starts."""


def register() -> None:
    return None
