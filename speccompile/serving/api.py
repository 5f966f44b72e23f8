"""Request schemas and the error format of the OpenAI-compatible API.

Bodies are validated in pydantic *strict* JSON mode: ``"max_tokens": "5"`` or
``"stream": 1`` is a 400, not a silent coercion, because a client that sends the wrong
type has a bug it should hear about. Fields that change nothing in the answer (``user``,
``store``, ``metadata``, ``service_tier``, ...) are ignored; every OpenAI field that would
change it and that the engine cannot honour with its non-default value (``functions``,
``audio``, ``echo``, ...) is refused with a 400
naming the field -- an application that asked for a tool call or a bias and got plain
text would never know.
"""
from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# below this temperature the distribution is a numerical argmax; sampling it would
# overflow exp(logits / T), so it is decoded greedily (vLLM uses the same epsilon)
GREEDY_EPS = 1e-5


class APIError(Exception):
    """An error to return in the OpenAI schema."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status)


def validation_error(err: ValidationError) -> APIError:
    """The first pydantic error as a 400 naming its field (dotted path)."""
    first = err.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    if first.get("type") == "model_type" and not loc:
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    where = f"'{loc}': " if loc else ""
    return APIError(400, f"{where}{first.get('msg')}", param=loc or None, code="invalid_value")


# field -> the values of it that ask for nothing (an empty bias, no tools, text only)
UNHONOURED: dict[str, list] = {"functions": [[]], "function_call": ["none"],
                               "audio": [], "modalities": [["text"]], "web_search_options": [], "reasoning_effort": []}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class CalledFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it (developer is system)."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class _Common(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, description="0 or -1: no top-k cut (vLLM convention)")
    seed: int | None = None
    stop: str | list[str] | None = Field(None)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10, description="extension (vLLM's, HF's): 1 = off")
    min_p: float | None = Field(None, ge=0, le=1, description="extension (vLLM's): 0 = off")
    logit_bias: dict | None = Field(None, description='{"TOKEN_ID": BIAS}, -100..100')
    prediction: dict | None = Field(None, description='Predicted Outputs: {"type": "content", "content": text or '
                                    '[{"type": "text", "text": ...}]}, text the answer is expected to repeat')
    user: str | None = None
    ignore_eos: bool = False
    speculative: bool = Field(True, description="extension: false decodes this request without "
                              "speculation (A/B against speculation in one server, as bench --endpoint --ab does)")
    response_format: dict | None = Field(None, description="{'type': 'text' | 'json_object' | 'json_schema', "
                                         "'json_schema': {'name', 'schema', 'strict'}}: every token obeys it")
    # OpenAI fields that change the answer and are not honoured: refused when set (UNHONOURED)
    functions: list | None = None
    function_call: str | dict | None = None
    audio: dict | None = None
    modalities: list | None = None
    web_search_options: dict | None = None
    reasoning_effort: str | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise APIError(400, "'stop' takes at most 4 sequences", param="stop", code="invalid_value")
        return [s for s in stops if s]

    def check_supported(self) -> None:
        for name, harmless in UNHONOURED.items():
            value = getattr(self, name)
            if value is not None and value not in harmless:
                raise APIError(400, f"'{name}' is not supported by this server", param=name,
                               code="unsupported_value")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options",
                           code="invalid_value")

    def sampling_values(self, defaults: dict) -> dict:
        """SamplingParams' fields: temperature/top_p/top_k with the model's defaults filled in,
        seed, min_p, the penalties and the logit bias."""
        t = self.temperature if self.temperature is not None else float(defaults.get("temperature", 1.0))
        top_k = self.top_k if self.top_k is not None else int(defaults.get("top_k", 0))
        return {"temperature": 0.0 if t < GREEDY_EPS else t,
                "top_p": self.top_p if self.top_p is not None else float(defaults.get("top_p", 1.0)),
                "top_k": max(0, top_k),
                "seed": None if self.seed is None else self.seed % (1 << 64),
                "min_p": self.min_p or 0.0, "frequency_penalty": self.frequency_penalty or 0.0,
                "presence_penalty": self.presence_penalty or 0.0,
                "repetition_penalty": 1.0 if self.repetition_penalty is None else self.repetition_penalty,
                "logit_bias": self.logit_bias or ()}

    def prediction_text(self) -> str | None:
        """The text of ``prediction`` (OpenAI's ``{"type": "content", "content": ...}``), or None."""
        if self.prediction is None:
            return None
        content = self.prediction.get("content")
        if self.prediction.get("type") != "content" or content is None:
            raise APIError(400, "'prediction' must be {\"type\": \"content\", \"content\": text or text parts}",
                           param="prediction", code="invalid_value")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise APIError(400, "'prediction.content' parts must be {\"type\": \"text\", \"text\": ...}",
                               param="prediction.content", code="invalid_value")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, "'prediction.content' must be a string or a list of text parts",
                           param="prediction.content", code="invalid_value")
        return content

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list | None = None  # OpenAI function definitions (runtime/tools.py)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None  # calls are parsed from the answer: several are always allowed
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value")

    def logprob_count(self) -> int | None:
        """Alternatives reported per token, or None when logprobs are not asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError(400, "'echo' is not supported", param="echo", code="unsupported_value")
        if self.suffix:
            raise APIError(400, "'suffix' is not supported", param="suffix", code="unsupported_value")
        if self.best_of not in (None, 1):
            raise APIError(400, "only best_of = 1 is supported", param="best_of", code="unsupported_value")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) > 1:
            raise APIError(400, "one prompt per request is supported", param="prompt", code="unsupported_value")

    def logprob_count(self) -> int | None:
        return self.logprobs

    def token_limit(self) -> int | None:
        # the legacy endpoint's documented default is 16 tokens
        return self.max_tokens if self.max_tokens is not None else 16


def chat_logprobs(entries: list, token_bytes) -> dict:
    """Chat's ``logprobs`` object for engine entries (id, logprob, [(id, logprob)])."""
    def one(tok: int, lp: float) -> dict:
        b = token_bytes(tok)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    return {"content": [{**one(t, lp), "top_logprobs": [one(i, v) for i, v in top]} for t, lp, top in entries],
            "refusal": None}


def completion_logprobs(entries: list, token_bytes, offset: int) -> dict:
    """The legacy endpoint's ``logprobs`` object; ``offset``: characters of text before these tokens."""
    def text(tok: int) -> str:
        return token_bytes(tok).decode("utf-8", errors="replace")

    tokens = [text(t) for t, _, _ in entries]
    offsets = [offset + sum(len(x) for x in tokens[:i]) for i in range(len(tokens))]
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [{text(i): v for i, v in top} for _, _, top in entries], "text_offset": offsets}
