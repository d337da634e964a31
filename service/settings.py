"""Every tunable of the service in one place (environment variables BEAMSERVE_*)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from model.options import COMPUTE_TYPES
from service import registry
from service.batching import BatchingConfig, Mode
from service.registry import ModelEntry

ComputeTypeName = Literal[COMPUTE_TYPES]  # type: ignore[valid-type]
Front = Literal["haproxy", "serve"]  # the HTTP front (service/api/front.py)
Allocator = Literal["auto", "jemalloc", "system"]  # model replicas' malloc (service/engine/allocator.py)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BEAMSERVE_", extra="ignore")

    models: str = Field("en-de,en-fr", description="comma-separated model names or directories, one per pair")
    # Models with their languages and settings (service/registry.py): inline JSON, a JSON or YAML file's
    # path, or a list in the Serve config's args. When set, `models` is not read.
    model_registry: str | list[dict[str, Any]] = ""
    # The model pool (service/engine/pool.py) for registry entries with "pool": true.
    pool_replicas: int = 1  # replicas of the pool deployment (each with replica_cpus, replica_gpus)
    pool_models_per_replica: int = 4  # models a pool replica holds at once; past it, the least recently used goes
    host: str = "127.0.0.1"
    # The HTTP front (service/api/front.py): haproxy (Ray Serve's high-throughput mode) or serve (its Python proxy).
    proxy: Front = "haproxy"
    port: int = 8000
    metrics_host: str = "127.0.0.1"  # where Prometheus metrics are served (elsewhere than loopback: a relay)
    metrics_port: int = 8080  # Prometheus metrics port
    num_cpus: int | None = None  # CPUs given to the local Ray instance (default: all usable)
    num_gpus: int | None = None  # GPUs given to the local Ray instance (default: Ray's count of the host's)
    replica_cpus: float = 1.0  # Ray CPUs each model replica asks for
    # GPUs per model replica (default: the GPU replicas share the GPUs Ray has, service/app.py gpu_share).
    replica_gpus: float | None = None
    threads: int | None = None  # torch intra-op threads per replica (default: ceil(replica_cpus))
    device: str | None = None  # cpu or cuda (default: cuda when present)
    dtype: str | None = None  # float32, float16, bfloat16 (default: float16 on cuda, float32 on cpu)
    # Continuous batching on the static decode state, CUDA graphs replayed on a GPU (service/engine/slot_runner.py).
    # Unset: on a GPU, off on a CPU (uses_static_slots).
    static_slots: bool | None = None
    # The static decode state's step through torch.compile's inductor (model/decode/slot_decoder.py), every
    # bucket compiled before the replica is ready; on implies static_slots.
    compiled_step: bool = False
    compute_type: ComputeTypeName | None = None  # CTranslate2's names (model/kernels/compute_type.py); not with dtype
    # Each model's engine in a process of its own (service/engine/engine_process.py), away from the GIL of the
    # replica's event loop; false: a thread of the replica's process. Unset: uses_engine_process.
    engine_process: bool | None = None
    # Serve's logging_config for `beamserve serve` (the Serve config sets its own): JSON lines in each
    # replica's log file under Ray's logs directory, one summary per request (service/request_log.py).
    log_encoding: Literal["JSON", "TEXT"] = "JSON"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # OpenTelemetry traces of requests (service/tracing.py), exported over OTLP/HTTP to this collector
    # (http://collector:4318, or its full /v1/traces URL); empty: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
    # OTEL_EXPORTER_OTLP_ENDPOINT when set, else tracing off.
    otlp_endpoint: str = ""
    # The share of requests traced that come without a sampled traceparent; one that comes with one is traced.
    trace_ratio: float = Field(1.0, ge=0.0, le=1.0)
    allocator: Allocator = "auto"  # model replicas' malloc: jemalloc when the host has it (service/engine/allocator.py)
    max_texts: int = 64  # texts per request
    max_text_chars: int = 2000  # characters per text
    max_body_bytes: int = 1_000_000  # request body
    max_document_bytes: int = 30_000_000  # a document upload's body (/v2/document, /translate_file), as DeepL's
    body_timeout_s: float = 10.0  # a request body that stops arriving for this long gets 408
    max_beam_size: int = 8
    max_decoding_length: int = 256
    request_timeout_s: float = 30.0  # past this, 504
    max_in_flight: int = 512  # requests a gateway replica holds at once; past it, they wait at the front
    max_queued: int = 64  # requests the front holds per gateway replica past max_in_flight; past it, 503 at once
    drain_timeout_s: float = 40.0  # on SIGTERM, how long accepted requests may take to finish
    gateway_replicas: int = 1  # HTTP ingress replicas (beamserve serve; the Serve config autoscales them)
    # The models in the ingress's own process (service/routing/local_handle.py): a request crosses no second
    # process, and ingress and models scale as one. Unset: colocated when the registry has one model
    # and no pool (uses_colocation).
    colocate: bool | None = None
    # API keys and their limits (service/api/keys.py): off unless api_keys or api_keys_file is set.
    api_keys: str = ""  # comma-separated keys, each with the key_* limits below
    api_keys_file: str = ""  # a JSON list of {"key", "name", and any of the key_* limits without key_}
    # The keys `beamserve keys` adds, revokes and rotates in the records store (records_storage), read by every
    # gateway replica within a second of a change; on: every request needs a key.
    api_keys_store: bool = False
    key_requests_per_minute: int = 0  # 0: no limit
    key_characters_per_day: int = 0
    key_characters_per_month: int = 0  # a 30-day window
    # Keys off: each client address's limits (LibreTranslate's per-client limits), 0: none. The address is the
    # connection's, as the front saw it; where that is one of trusted_proxies (comma-separated addresses or
    # networks: a load balancer, an ingress), the last address its X-Forwarded-For names that is not one of them.
    address_requests_per_minute: int = 0
    address_characters_per_day: int = 0
    trusted_proxies: str = ""
    limits_storage: str = ""  # redis://host:6379 (or valkey://) shared by the gateway replicas; empty: each its own
    cors_origins: str = ""  # comma-separated origins browsers may call from ("*": any); empty: no CORS
    # The server's address as its clients reach it (https://translate.example.com), for the links it answers
    # (LibreTranslate's translatedFileUrl); empty: http://host:port as it listens. Never the request's Host.
    public_url: str = ""
    # Where glossaries and documents live (service/store/records.py): redis://, valkey:// or sqlite:///path;
    # empty: limits_storage when it is a Redis or Valkey, else an SQLite file in ~/.local/share/beamserve.
    records_storage: str = ""
    # The gateway's translation cache (service/routing/cache.py), per gateway replica; either at 0 turns it off.
    cache_entries: int = 50_000
    cache_bytes: int = 64_000_000
    # The lookup indexes of translation memories each gateway replica keeps (service/store/memories.py), in bytes
    # of their units and word index: the least recently used out first. One memory's index is kept whatever.
    memory_index_bytes: int = 256_000_000
    # Batching: BatchingConfig's fields (service/engine/scheduler.py, where each is described), tunable live
    # through the Serve config's user_config. Sizes left None are the replica's device's (sized_for).
    mode: Mode = BatchingConfig.mode
    max_batch_tokens: int | None = None
    max_batch_size: int | None = None
    batch_wait_ms: float = BatchingConfig.batch_wait_ms
    max_queue: int | None = None
    decode_slots: int | None = None
    max_waiting_steps: int = BatchingConfig.max_waiting_steps
    waiting_served_ratio: float = BatchingConfig.waiting_served_ratio
    alone_max_sentences: int = BatchingConfig.alone_max_sentences
    max_queue_wait_s: float = BatchingConfig.max_queue_wait_s

    @model_validator(mode="after")
    def _compiled_step_on_static_slots(self) -> Settings:
        if self.compiled_step and self.static_slots is False:
            raise ValueError("compiled_step compiles the static decode state's step: it needs static_slots")
        return self

    def entries(self) -> list[ModelEntry]:
        """The models to serve (service/registry.py); ValueError says what is wrong."""
        return registry.entries(self.models, self.model_registry)

    def for_entry(self, entry: ModelEntry) -> Settings:
        """These settings with the entry's own over them, validated as the server's are."""
        return Settings(**{**self.model_dump(), **entry.settings})

    def uses_static_slots(self, device_type: str) -> bool:
        """static_slots, or unset: on a GPU, where replaying the step's graphs decodes faster than the eager
        decoder; off on a CPU, where the static state decodes slower (docs/benchmarks.md has both). compiled_step
        compiles that state's step, so it turns it on."""
        if self.static_slots is not None:
            return self.static_slots
        return device_type == "cuda" or self.compiled_step

    def uses_engine_process(self, entry: ModelEntry) -> bool:
        """engine_process, or unset: for every model but a pooled one, which loads on demand (a process would add
        its start, about 2 s, to each load) and sees little traffic (docs/operations.md)."""
        return self.engine_process if self.engine_process is not None else not entry.pool

    def uses_colocation(self, entries: list[ModelEntry]) -> bool:
        """colocate, or unset: when the registry's one model is not pooled. Beside its decoding, a decoded
        request then costs the server less CPU than crossing to a model deployment (docs/benchmarks.md#serving-path)."""
        if self.colocate is not None:
            return self.colocate
        return len(entries) == 1 and not entries[0].pool

    def link_base(self) -> str:
        """Where the links the server answers point: public_url, else the address it listens on."""
        return self.public_url.rstrip("/") or f"http://{self.host}:{self.port}"

    def origins(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]
