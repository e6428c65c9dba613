"""Settings: what each setting means, its default and the rules between them. Where values come
from (a TOML file, the environment, flags): app/sources.py."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.values import (
    DAY_S,
    DEFAULT_GRPC_PORT,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_INSTANCES,
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_QUEUE_CAPACITY,
    DEFAULT_REQUEST_TIMEOUT_S,
    bearer_token,
    derive_defaults,
    http_url,
    listed_names,
    redis_scheme,
)

ENV_PREFIX = "BATCHSERVE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"

class BatchSettings(BaseModel):
    """What to serve and how to batch it: the settings a model of a repository may set for
    itself (anything it leaves unset takes the server's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        "minilm",
        description="builtin name (minilm, linear, mlp), module:callable, or a .pt / .pt2 file",
    )
    devices: str = Field("auto", description="comma list: cpu, cuda, cuda:0,cuda:1, or auto")
    max_batch_size: int = Field(
        DEFAULT_MAX_BATCH_SIZE, ge=1, le=65536, description="most items in one model call"
    )
    max_wait_ms: float = Field(
        DEFAULT_MAX_WAIT_MS, ge=0, allow_inf_nan=False,
        description="longest the device stays idle while a batch fills (a ceiling; default 5, "
        "at most half of request_timeout_s)",
    )
    queue_capacity: int = Field(
        DEFAULT_QUEUE_CAPACITY, ge=1, description="items the bounded queue holds"
    )
    request_timeout_s: float = Field(
        DEFAULT_REQUEST_TIMEOUT_S, gt=0, le=DAY_S, allow_inf_nan=False,
        description="default deadline of a request, arrival to answer",
    )
    max_instances: int = Field(
        DEFAULT_MAX_INSTANCES, ge=1,
        description="most instances in one request (default: 256, at most queue_capacity)",
    )
    latency_target_ms: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="largest batches whose predicted completion keeps the oldest item within "
        "this (default: none)",
    )
    priority_levels: int = Field(
        2, ge=1, le=64, description="request priority levels, 1 the most urgent"
    )
    default_priority_level: int | None = Field(
        None, ge=1, description="level of a request that names none (default: the lowest)"
    )
    max_batch_tokens: int | None = Field(
        None, ge=1, description="text models: most padded tokens in one batch (default: twice "
        "max_batch_size x a typical item's tokens)"
    )
    length_window: int = Field(
        256, ge=1, description="text models: waiting items looked at to batch similar lengths "
        "together (1: arrival order)",
    )
    cuda_graphs: bool | Literal["auto"] = Field(
        "auto", description="on CUDA, run a model's batches as CUDA graphs captured at warm-up "
        "(a fixed-shape tensor model's, or a padded text model's by rows and length; auto: "
        "where the model qualifies, quietly eager where not; true: the same, warning where "
        "not; docs/cuda-graphs.md)",
    )

    _explicit: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="wrap")
    @classmethod
    def _derive_defaults(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        settings = handler(derive_defaults(data, cls.model_fields))
        settings._explicit = frozenset(data)
        return settings

    @property
    def explicit(self) -> frozenset[str]:
        """Names of the settings the user set (flags, environment, file), not derived ones."""
        return self._explicit

    @model_validator(mode="after")
    def _consistent(self) -> Any:
        if self.max_wait_ms / 1000.0 >= self.request_timeout_s:
            raise ValueError(
                f"max_wait_ms ({self.max_wait_ms}) must be shorter than request_timeout_s "
                f"({self.request_timeout_s}): every request would time out waiting for its batch"
            )
        if self.max_instances > self.queue_capacity:
            raise ValueError(
                f"max_instances ({self.max_instances}) exceeds queue_capacity "
                f"({self.queue_capacity}): a request that large could never be admitted"
            )
        if (self.default_priority_level is not None
                and self.default_priority_level > self.priority_levels):
            raise ValueError(
                f"default_priority_level ({self.default_priority_level}) is not one of the "
                f"priority_levels (1 to {self.priority_levels})"
            )
        return self

    @property
    def default_level(self) -> int:
        return self.default_priority_level or self.priority_levels

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

    @property
    def latency_target_s(self) -> float | None:
        return None if self.latency_target_ms is None else self.latency_target_ms / 1000.0


class ModelSettings(BatchSettings):
    """One model of a repository (its ``config.toml``, or a load request's ``config``)."""

    versions: list[int] | None = Field(
        None, description="version numbers to serve (default: the newest only)"
    )


class Settings(BaseSettings, BatchSettings):
    """Every knob of the server. Build it once (``load_settings``) and pass it down."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    model_name: str | None = Field(
        None, description="name under /v2/models/ and in metrics (default: derived from model)"
    )
    model_repository: str | None = Field(
        None, description="a folder of models in Triton's layout: NAME/config.toml, NAME/1/..."
    )
    model_control_mode: Literal["none", "explicit"] = Field(
        "none", description="none: load every model at start; explicit: --load-model and the API"
    )
    load_model: Annotated[list[str], NoDecode, BeforeValidator(listed_names)] = Field(
        [], description="explicit mode: a model to load at start (repeatable; in the "
        "environment, names separated by commas)"
    )
    default_model: str | None = Field(
        None, description="the model POST /predict serves (default: the only one)"
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1, description="largest request body")
    max_receiving_bytes: int | None = Field(
        None, ge=1, description="most bytes of request bodies a process holds while they "
        "arrive, past which a request whose body is still coming gets 503 busy (default: a "
        "quarter of the memory the server may use, a memory limit counting, shared by its "
        "processes; at least max_body_bytes)",
    )
    api_key: Annotated[str | None, AfterValidator(bearer_token)] = Field(
        None, min_length=1, description="when set, inference and model control need "
        "'Authorization: Bearer <key>' (visible ASCII characters)")
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads per process (default: torch's choice, at "
        "most the usable cores: a CPU quota counts)"
    )
    read_timeout_s: float = Field(
        DEFAULT_REQUEST_TIMEOUT_S, gt=0, le=DAY_S, allow_inf_nan=False,
        description="longest a request may take to arrive (then 408, closed) and its client "
        "may take none of its answer (then reset; default request_timeout_s, 5 s at least)",
    )
    keep_alive_s: int = Field(
        5, ge=1, le=int(DAY_S), description="how long a connection may idle between requests "
        "before it is closed; set it above a gateway's idle timeout for its connections (AWS "
        "ALB: 60 s), or the gateway may send a request on a connection being closed",
    )
    max_connections: int = Field(
        1000, ge=1, description="open connections (and requests in flight) per process, past "
        "which new ones get 503 (gRPC: as many connections, and calls in flight, past which "
        "RESOURCE_EXHAUSTED); the soft limit on open files is raised to fit, up to the hard limit",
    )
    frontends: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        "auto", description="front-end processes feeding one device process (1: one process; "
        "auto: 1 on 4 cores or fewer, else cores - 2, at most 8)",
    )
    frontend_timeout_s: float = Field(
        30.0, ge=1, le=DAY_S, allow_inf_nan=False,  # under a second: GC pauses would count
        description="a front end that has not answered the device process for this long (its "
        "event loop blocked) is killed and replaced",
    )
    device_timeout_s: float | None = Field(
        None, ge=1, le=DAY_S, allow_inf_nan=False,  # under a second: a slow batch would count
        description="a model call (a batch, or the wait for its device work) running this long "
        "marks its device thread stuck: health unhealthy, /v2/health/live 503, for the "
        "orchestrator to restart the server (default: the model's request_timeout_s, at "
        "least 10)",
    )
    host: str = Field("127.0.0.1", min_length=1, description="address to bind")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0: any free port)")
    grpc_port: int = Field(
        DEFAULT_GRPC_PORT, ge=0, le=65535, description="port of the Open Inference Protocol over "
        "gRPC, on the same host (0: no gRPC; 8002 where port is 8001)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    log_format: Literal["text", "json"] = Field("text", description="log line format")
    otel_endpoint: Annotated[str | None, AfterValidator(http_url)] = Field(
        None, description="send OpenTelemetry traces to this OTLP/HTTP base URL (default: "
        "OTEL_EXPORTER_OTLP_ENDPOINT if set, else no traces; needs the otel extra)",
    )
    # Job-queue mode (``batchserve worker``, app/jobs/)
    redis_url: Annotated[str, AfterValidator(redis_scheme)] = Field(
        "redis://127.0.0.1:6379/0", description="job mode: the Redis server"
    )
    job_stream: str = Field("batchserve:jobs", description="job mode: stream of jobs")
    job_group: str = Field("batchserve", description="job mode: consumer group of the workers")
    job_lease_s: float = Field(
        60.0, gt=0, le=DAY_S, allow_inf_nan=False,
        description="job mode: a job not finished or renewed within this is taken over"
    )
    job_max_deliveries: int = Field(
        3, ge=1, description="job mode: deliveries before a job is dead-lettered"
    )
    result_ttl_s: int = Field(
        86400, ge=1, le=int(365 * DAY_S), description="job mode: how long results are kept"
    )
    worker_metrics_port: int | None = Field(
        None, ge=0, le=65535, description="job mode: serve /metrics on host:port (default: off)"
    )

    @model_validator(mode="after")
    def _consistent_serving(self) -> Settings:
        for single in ("model", "model_name"):
            if self.model_repository is not None and single in self.explicit:
                raise ValueError(
                    f"{single} ({getattr(self, single)}) is for a single model, and "
                    f"model_repository ({self.model_repository}) names its models itself: give one"
                )
        if self.max_receiving_bytes is not None and self.max_receiving_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_receiving_bytes ({self.max_receiving_bytes}) is less than max_body_bytes "
                f"({self.max_body_bytes}): a body of the largest size could never arrive"
            )
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(f"port and grpc_port are both {self.port}: each needs its own")
        if self.load_model and self.model_control_mode != "explicit":
            raise ValueError(
                f"load_model ({', '.join(self.load_model)}) needs model_control_mode explicit "
                f"(it is {self.model_control_mode}: every model loads at start)"
            )
        return self

    # A TOML file's values, below the environment: load_settings (app/sources.py) sets them on
    # the subclass it builds; Settings itself has none.
    file_values: ClassVar[dict[str, Any]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Init kwargs (flags), then the environment, then the file; no dotenv, no secrets dir.
        return (init_settings, env_settings, InitSettingsSource(settings_cls, cls.file_values))


DRAIN_MARGIN_S = 5.0  # beyond the request timeout, for the last answers to be written


def drain_limit_s(settings: Settings) -> float:
    """How long a drain (and then a device thread's end) may take: the longest a request
    admitted before it may still run, and a margin for its answer to be written."""
    return settings.request_timeout_s + DRAIN_MARGIN_S
