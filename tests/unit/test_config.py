from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from app import supervisor
from app.cli import HTTP_SETTINGS, JOB_SETTINGS, build_parser, main
from app.config import ModelSettings, Settings
from app.errors import ConfigError
from app.sources import load_settings, unknown_variables
from app.supervisor import frontend_count
from app.values import without_password
from app.version import __version__
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv("BATCHSERVE_" + name.upper(), raising=False)
    monkeypatch.delenv("BATCHSERVE_CONFIG", raising=False)
    s = load_settings()
    assert (s.model, s.devices, s.max_batch_size, s.max_wait_ms) == ("minilm", "auto", 32, 5)
    assert (s.queue_capacity, s.request_timeout_s, s.max_instances) == (1024, 30, 256)
    assert s.max_body_bytes == 16 * 1024 * 1024 and s.api_key is None


def test_priority_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_batch_size = 8\nqueue_capacity = 300\nmax_wait_ms = 2.5\n")
    monkeypatch.setenv("BATCHSERVE_QUEUE_CAPACITY", "400")
    monkeypatch.setenv("BATCHSERVE_MAX_WAIT_MS", "3")
    s = load_settings(cfg, {"max_wait_ms": 4.0, "model": None})
    assert s.max_batch_size == 8  # file
    assert s.queue_capacity == 400  # env beats file
    assert s.max_wait_ms == 4.0  # flag beats env
    assert s.model == "minilm"  # None means "flag not given"


def test_config_file_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('model = "linear"\n')
    monkeypatch.setenv("BATCHSERVE_CONFIG", str(cfg))
    assert load_settings().model == "linear"


def test_contradictions_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="max_wait_ms.*request_timeout_s"):
        load_settings(None, {"max_wait_ms": 2000, "request_timeout_s": 1})
    with pytest.raises(ConfigError, match="max_instances.*queue_capacity"):
        load_settings(None, {"max_instances": 50, "queue_capacity": 10})
    with pytest.raises(ConfigError, match=r"max_receiving_bytes \(1000\) is less than "
                                          r"max_body_bytes \(2000\)"):
        load_settings(None, {"max_receiving_bytes": 1000, "max_body_bytes": 2000})
    with pytest.raises(ConfigError, match="port and grpc_port are both 9000: each needs its own"):
        load_settings(None, {"port": 9000, "grpc_port": 9000})
    assert load_settings(None, {"port": 0, "grpc_port": 0}).grpc_port == 0  # 0 and 0: no gRPC


@pytest.mark.parametrize(
    ("given", "derived"),
    [
        ({"queue_capacity": 4}, {"max_instances": 4}),
        ({"max_instances": 3000}, {"queue_capacity": 3000}),
        ({"max_batch_size": 4096}, {"queue_capacity": 4096, "max_instances": 256}),
        ({"max_batch_size": 64}, {"queue_capacity": 1024}),
        ({"max_batch_size": 4096, "max_instances": 5000}, {"queue_capacity": 5000}),
        ({"max_batch_size": 4096, "queue_capacity": 16}, {"queue_capacity": 16}),
        ({"request_timeout_s": 0.004}, {"max_wait_ms": 2.0}),
        ({"max_wait_ms": 40_000}, {"request_timeout_s": 80.0, "read_timeout_s": 80.0}),
        ({}, {"read_timeout_s": 30.0}),
        ({"request_timeout_s": 0.05}, {"read_timeout_s": 5.0}),  # a network's few seconds
        ({"request_timeout_s": 1, "read_timeout_s": 0.5}, {"read_timeout_s": 0.5}),
        ({"queue_capacity": 4, "max_instances": 2}, {"max_instances": 2}),
        ({"port": 8001}, {"grpc_port": 8002}),
        ({"port": 9000}, {"grpc_port": 8001}),
        ({"port": 8001, "grpc_port": 0}, {"grpc_port": 0}),
    ],
)
def test_defaults_give_way_to_what_the_user_set(given: dict, derived: dict) -> None:
    """A default never contradicts a value the user set; only explicit values can clash."""
    s = load_settings(None, given)
    assert {k: getattr(s, k) for k in derived} == derived
    assert s.explicit == set(given)


def test_a_model_gets_no_server_setting_derived_from_its_own() -> None:
    """A model's settings derive their own defaults, and none of the server's (read_timeout_s
    follows request_timeout_s on the server only)."""
    model = ModelSettings(request_timeout_s=0.004)
    assert model.max_wait_ms == 2.0 and "read_timeout_s" not in model.model_dump()


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"request_timeout_s": float("inf")}, "request_timeout_s: Input should be a finite"),
        ({"max_wait_ms": "inf"}, r"max_wait_ms: Input should be a finite number \(set by "
                                 r"--max-wait-ms\)$"),
        ({"latency_target_ms": float("nan")}, "latency_target_ms: Input should be a finite"),
        ({"job_lease_s": float("inf")}, "job_lease_s: Input should be a finite"),
        ({"request_timeout_s": 1e300}, "request_timeout_s: Input should be less than or equal"),
        ({"job_lease_s": 1e12}, "job_lease_s: Input should be less than or equal"),
        ({"result_ttl_s": 10**20}, "result_ttl_s: Input should be less than or equal"),
        ({"max_wait_ms": 1e9}, r"max_wait_ms \(1000000000.0\) must be shorter than "
                               r"request_timeout_s \(86400.0\)"),
    ],
)
def test_endless_times_are_refused_naming_only_what_was_set(given: dict, named: str) -> None:
    """An infinite or absurdly long time would overflow a timer, a thread join or Redis at run
    time (a traceback at shutdown); it is refused at start-up, naming the setting given."""
    with pytest.raises(ConfigError, match=named):
        load_settings(None, given)


def test_an_http_port_from_the_environment_moves_grpc_off_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSERVE_PORT", "8001")
    s = load_settings()
    assert (s.port, s.grpc_port, s.explicit) == (8001, 8002, {"port"})


def test_the_environment_alone_gives_a_working_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSERVE_QUEUE_CAPACITY", "4")
    s = load_settings()
    assert (s.queue_capacity, s.max_instances) == (4, 4) and s.explicit == {"queue_capacity"}


def test_bad_values_and_unknown_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_settings(None, {"max_batch_size": 0})
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_batch_sise = 8\ncolour = 3\n")
    with pytest.raises(ConfigError, match=re.escape(
            "unknown settings colour, max_batch_sise (did you mean max_batch_size?)")):
        load_settings(cfg)
    cfg.write_text("".join(f"colour{i} = 3\n" for i in range(7)))  # five named, the rest counted
    with pytest.raises(ConfigError, match=r"colour0, colour1, colour2, colour3, colour4 and 2 "
                                          r"more$"):
        load_settings(cfg)
    cfg.write_text("max_batch_size = [\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(cfg)
    cfg.write_bytes(b'model = "linear"\n# \xff\xfe\n')
    with pytest.raises(ConfigError, match="not valid TOML: the byte at offset 19 is not UTF-8"):
        load_settings(cfg)
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_shipped_example_config_is_valid() -> None:
    paths = sorted((ROOT / "config").glob("*.toml"))
    assert paths  # a glob that finds nothing would check nothing
    for path in paths:
        load_settings(path)  # raises ConfigError for a key or value it does not take


def test_the_shipped_config_documents_every_setting() -> None:
    text = (ROOT / "config" / "default.toml").read_text()
    keys = set(re.findall(r"^(?:# )?([a-z_]+) *=", text, re.MULTILINE))
    assert set(Settings.model_fields) <= keys


def test_the_shipped_config_sets_each_key_to_its_default() -> None:
    """config/default.toml says it holds the built-in defaults: each key it sets is one."""
    with (ROOT / "config" / "default.toml").open("rb") as file:
        shipped = tomllib.load(file)
    assert shipped and {key: Settings.model_fields[key].default for key in shipped} == shipped


def test_the_docs_name_every_variable_and_only_real_ones() -> None:
    """docs/configuration.md (jobs.md for job-queue mode) names each setting's variable, and
    every ``BATCHSERVE_`` variable the README and docs name is a setting's (or the config
    file's)."""
    tables = "".join((ROOT / "docs" / name).read_text() for name in ("configuration.md", "jobs.md"))
    named = set(re.findall(r"BATCHSERVE_([A-Z_]*[A-Z])", tables))
    assert {name.upper() for name in Settings.model_fields} <= named
    pages = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    prose = "".join(page.read_text() for page in pages)
    assert set(re.findall(r"BATCHSERVE_([A-Z_]*[A-Z])", prose)) - {"CONFIG"} <= {
        name.upper() for name in Settings.model_fields}


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    return capsys.readouterr().out


def flags_in(text: str) -> set[str]:
    return {name for name in Settings.model_fields if "--" + name.replace("_", "-") in text}


def test_every_setting_has_a_flag_in_the_command_that_reads_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """serve lists no job-mode setting, worker no HTTP one; between them, every setting."""
    serve, worker = help_of("serve", capsys), help_of("worker", capsys)
    assert flags_in(serve) | flags_in(worker) == set(Settings.model_fields)
    assert not flags_in(serve) & JOB_SETTINGS and not flags_in(worker) & HTTP_SETTINGS
    assert "frontends" in flags_in(serve) and "redis_url" in flags_in(worker)


def test_version_is_one_line_and_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"batchserve {__version__}\n"


def test_help_says_each_default_once_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_of("serve", capsys).split())  # argparse wraps lines
    assert "None" not in text
    assert "default 30)" in text  # request_timeout_s: 30.0 in words
    options = text.split(" options: ", 1)[1]
    for entry in re.split(r" --", options):  # one flag's entry each
        assert len(re.findall(r"(?:\(|; |, )default\b", entry)) <= 1, entry


@pytest.mark.parametrize("single", [{"model": "linear"}, {"model_name": "x"}])
def test_a_repository_and_a_single_model_are_not_both_given(single: dict) -> None:
    with pytest.raises(ConfigError, match="model_repository"):
        load_settings(None, {"model_repository": "/tmp", **single})


def test_load_model_needs_explicit_control() -> None:
    with pytest.raises(ConfigError, match="load_model .* needs model_control_mode explicit"):
        load_settings(None, {"model_repository": "/tmp", "load_model": ["a"]})
    settings = load_settings(None, {"model_repository": "/tmp", "load_model": ["a", "b"],
                                    "model_control_mode": "explicit"})
    assert settings.load_model == ["a", "b"]


@pytest.mark.parametrize(("value", "names"), [
    ("a", ["a"]), ("a, b", ["a", "b"]), ('["a", "b"]', ["a", "b"]), ("", []),
])
def test_load_model_in_the_environment_is_names_by_commas_or_a_json_list(
    monkeypatch: pytest.MonkeyPatch, value: str, names: list[str]
) -> None:
    monkeypatch.setenv("BATCHSERVE_LOAD_MODEL", value)
    settings = load_settings(None, {"model_repository": "/tmp", "model_control_mode": "explicit"})
    assert settings.load_model == names


def test_load_model_that_is_no_list_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSERVE_LOAD_MODEL", "[a")
    with pytest.raises(ConfigError, match=r"load_model: '\[a' is not a JSON list"):
        load_settings(None, {"model_repository": "/tmp", "model_control_mode": "explicit"})


@pytest.mark.parametrize("name", ["host", "api_key"])
def test_an_empty_host_or_key_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Empty, a host would bind every interface and a key would let an empty token in: each is
    more likely a variable its deployment left blank than a wish."""
    monkeypatch.setenv("BATCHSERVE_" + name.upper(), "")
    with pytest.raises(ConfigError, match=f"{name}: String should have at least 1 character"):
        load_settings()


@pytest.mark.parametrize(("key", "shown"), [("sekrit\n", r"'\\n'"), ("a b", "' '"),
                                             ("k\u00e9y", "'\u00e9'")])
def test_a_key_no_header_carries_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, key: str,
                                                      shown: str) -> None:
    """A key read from a file written with its line break would refuse every client that sends
    the key: the start says so instead, naming the character, not the key."""
    monkeypatch.setenv("BATCHSERVE_API_KEY", key)
    with pytest.raises(ConfigError, match=f"api_key: holds {shown}: a key is visible ASCII") as e:
        load_settings()
    assert key.strip() not in str(e.value)
    assert make_settings(api_key="Ab0-._~+/=!#").api_key == "Ab0-._~+/=!#"


def test_frontends_is_a_number_or_auto_and_auto_follows_the_cores() -> None:
    assert make_settings().frontends == "auto"
    assert make_settings(frontends=3).frontends == 3
    with pytest.raises(ValueError):
        make_settings(frontends=0)
    with pytest.raises(ConfigError, match="frontends"):
        load_settings(None, {"frontends": "many"})
    assert load_settings(None, {"frontends": "4"}).frontends == 4
    assert [frontend_count("auto", cores) for cores in (1, 2, 4, 6, 10, 16, 64)] == [
        1, 1, 1, 4, 8, 8, 8]
    assert frontend_count(3, 64) == 3


def test_auto_front_ends_count_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-CPU quota on a 64-core host is one front end, not eight."""
    monkeypatch.setattr(supervisor, "usable_cores", lambda: 2)
    assert supervisor.frontend_count("auto") == 1
    monkeypatch.setattr(supervisor, "usable_cores", lambda: 16)
    assert supervisor.frontend_count("auto") == 8


def test_a_misspelt_variable_is_named_with_the_setting_it_resembles() -> None:
    warnings = unknown_variables({"BATCHSERVE_MAX_BATCH_SIZZE": "3", "BATCHSERVE_PORT": "1",
                                  "BATCHSERVE_CONFIG": "x.toml", "BATCHSERVE_ZZZ": "1",
                                  "HOME": "/root"})
    assert warnings == [
        "BATCHSERVE_MAX_BATCH_SIZZE is not a batchserve setting and is ignored; did you mean "
        "BATCHSERVE_MAX_BATCH_SIZE?",
        "BATCHSERVE_ZZZ is not a batchserve setting and is ignored",
    ]


@pytest.mark.parametrize(("given", "expected"), [("true", True), ("false", False),
                                                 ("0", False), ("yes", True), ("auto", "auto")])
def test_a_switch_flag_reads_its_word(given: str, expected: bool | str) -> None:
    """``--cuda-graphs false`` is off: the word goes to the setting, not to ``bool()``."""
    args = build_parser().parse_args(["serve", "--cuda-graphs", given])
    value = load_settings(None, {"cuda_graphs": args.cuda_graphs}).cuda_graphs
    assert value == expected and type(value) is type(expected)


def test_cuda_graphs_are_auto_unless_set() -> None:
    assert Settings().cuda_graphs == "auto"


def test_an_invalid_setting_names_what_set_it(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a flag, a variable and the config file, the one that wins is named; no value but a
    setting of several kinds' (another's may be a secret)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('max_batch_size = "eight"\n')
    wrong = "max_batch_size: Input should be a valid integer, unable to parse string as an integer"
    with pytest.raises(ConfigError, match=re.escape(f"{wrong} (set by {cfg})")):
        load_settings(cfg)
    monkeypatch.setenv("BATCHSERVE_MAX_BATCH_SIZE", "nine")
    with pytest.raises(ConfigError, match=re.escape(f"{wrong} (set by BATCHSERVE_MAX_BATCH_SIZE)")):
        load_settings(cfg)
    too_few = "max_batch_size: Input should be greater than or equal to 1"
    with pytest.raises(ConfigError, match=re.escape(f"{too_few} (set by --max-batch-size)")):
        load_settings(cfg, {"max_batch_size": 0})
    monkeypatch.delenv("BATCHSERVE_MAX_BATCH_SIZE")
    monkeypatch.setenv("BATCHSERVE_API_KEY", "hunter 2")
    with pytest.raises(ConfigError) as err:
        load_settings(None)
    assert str(err.value).endswith("(set by BATCHSERVE_API_KEY)") and "hunter" not in str(err.value)


def test_a_switch_flag_refuses_other_words() -> None:
    args = build_parser().parse_args(["serve", "--cuda-graphs", "maybe"])
    with pytest.raises(ConfigError) as err:
        load_settings(None, {"cuda_graphs": args.cuda_graphs})
    assert str(err.value) == (
        "invalid settings: cuda_graphs: Input should be a valid boolean, unable to interpret "
        "input or Input should be 'auto' (given 'maybe', set by --cuda-graphs)")


def test_a_redis_url_redis_cannot_use_is_refused() -> None:
    with pytest.raises(ConfigError, match="redis_url: 'localhost:6379' is not a redis://"):
        load_settings(None, {"redis_url": "localhost:6379"})
    with pytest.raises(ConfigError, match=re.escape("'http://:***@redis:6379' is not a redis://")):
        load_settings(None, {"redis_url": "http://:hunter2@redis:6379"})
    with pytest.raises(ConfigError, match=re.escape("'ftp://u:***@c' is not an http://")):
        load_settings(None, {"otel_endpoint": "ftp://u:hunter2@c"})
    for url in ("redis://h:1/0", "rediss://h", "unix:///run/redis.sock"):
        assert load_settings(None, {"redis_url": url}).redis_url == url


@pytest.mark.parametrize("url", ["notaurl", "ftp://collector", "http://", "127.0.0.1:4318"])
def test_an_otel_endpoint_the_exporter_cannot_use_is_refused(url: str) -> None:
    """It was taken, and each batch of spans then failed to export with a line in the log."""
    with pytest.raises(ConfigError, match=f"otel_endpoint: '{url}' is not an http:// or "):
        load_settings(None, {"otel_endpoint": url})


def test_an_otel_endpoint_over_http_or_https_is_taken() -> None:
    for url in ("http://collector:4318", "https://otel.example.com"):
        assert load_settings(None, {"otel_endpoint": url}).otel_endpoint == url
    assert load_settings(None, {}).otel_endpoint is None


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:hunter2@redis:6379/0", "redis://:***@redis:6379/0"),
    ("rediss://user:hunter2@[::1]:6379", "rediss://user:***@[::1]:6379"),
    ("redis://:pa@ss@h:1/0", "redis://:***@h:1/0"),  # an @ in the password
    ("redis://user@h", "redis://user@h"),  # no password: as it is
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ("redis://:hunter2@[::1:6379", "redis://***@[::1:6379"),  # no URL urlsplit takes
])
def test_a_urls_password_is_never_shown(url: str, shown: str) -> None:
    assert without_password(url) == shown
