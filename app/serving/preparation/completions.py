"""A text completion request checked and tokenised, wherever it then runs: a prompt as text or
token ids."""

from __future__ import annotations

from app.errors import BadRequestError
from app.protocol import CompletionRequest
from app.serving.preparation import generation as gen
from app.tenancy.tenants import ModelTarget, Principal


class CompletionPreparation(gen.Preparation[CompletionRequest]):
    """A text completion request checked and tokenised, wherever it then runs."""

    endpoint = "completions"

    def prepare(
        self,
        request: CompletionRequest,
        principal: Principal,
        target: ModelTarget,
        request_id: str,
    ) -> gen.Generation:
        if isinstance(request.prompt, str):
            self._refuse_if_never_fits(request.prompt, "prompt")
            prompt = self.model.tokenizer.encode(request.prompt)
        else:
            prompt = list(request.prompt)
            vocabulary = len(self.model.tokenizer)
            if not all(0 <= token < vocabulary for token in prompt):
                raise BadRequestError(
                    f"Token ids in `prompt` must be between 0 and {vocabulary - 1}.",
                    param="prompt",
                )
        return self._generation(request, prompt, principal, target, request_id)
