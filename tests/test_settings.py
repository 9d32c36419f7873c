"""Process settings: what an operator types is read as meant, and combinations that cannot
work are refused at start, not on the first request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dayzero import settings_help
from dayzero.settings import Settings
from dayzero.settings_help import settings_from_env, unknown_settings


@pytest.mark.parametrize("field", ["api_keys", "image_allowed_hosts"])
@pytest.mark.parametrize(
    ("raw", "values"),
    [("sesame", ["sesame"]), ("a.com", ["a.com"]), ("a, b,c", ["a", "b", "c"]), ('["x", "y"]', ["x", "y"]), ("", [])],
)
def test_lists_are_comma_separated_or_json(monkeypatch, field, raw, values):
    monkeypatch.setenv(f"DAYZERO_{field.upper()}", raw)
    assert getattr(Settings(), field) == values


def test_a_value_that_cannot_be_read_is_one_line_naming_its_variable(monkeypatch):
    monkeypatch.setenv("DAYZERO_IMAGE_ALLOWED_HOSTS", '["a.com"')
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert (
        str(error.value)
        == "DAYZERO_IMAGE_ALLOWED_HOSTS='[\"a.com\"': Expecting ',' delimiter: line 1 column 9 (char 8)"
    )


def test_an_item_of_a_list_is_named_by_its_variable_and_index(monkeypatch):
    monkeypatch.setenv("DAYZERO_API_KEYS", '["a", 1]')
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert str(error.value) == "DAYZERO_API_KEYS[1]=***: Input should be a valid string"  # (a key: not shown)


@pytest.mark.parametrize("raw", ['["", "sesame"]', '[" "]', '["sesame", ""]', ",", "sesame,,open", "sesame,"])
def test_an_empty_api_key_is_refused_not_an_open_door(monkeypatch, raw):
    """A JSON list with an empty key turned authentication on and let every request without a
    key in (``Authorization`` absent reads as the key ""). A comma list dropped its empty items
    unsaid: "," served with no authentication at all."""
    monkeypatch.setenv("DAYZERO_API_KEYS", raw)
    with pytest.raises(ValueError, match=r"^DAYZERO_API_KEYS=.*: an empty key would let every request in"):
        settings_from_env()


def test_a_lease_longer_than_the_registry_remembers_a_worker_is_refused(monkeypatch):
    """DAYZERO_LEASE_S=100000: workers beat every quarter lease, beyond the registry's 600 s memory
    of a silent worker, so none ever counted as live and up waited for ever."""
    monkeypatch.setenv("DAYZERO_LEASE_S", "100000")
    with pytest.raises(ValueError, match=r"^DAYZERO_LEASE_S='100000': Input should be less than or equal to 600"):
        settings_from_env()


FLOAT_SETTINGS = [name for name, field in Settings.model_fields.items() if field.annotation is float]


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "1e400"])
def test_a_float_setting_that_is_not_finite_is_refused(monkeypatch, name, raw):
    """DAYZERO_REDIS_ANSWER_WITHIN_S=inf was accepted (up waited for ever on a Redis that never answered),
    as was inf for every float setting bounded only below; nan was refused as not "greater than 0"."""
    monkeypatch.setenv(f"DAYZERO_{name.upper()}", raw)
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert str(error.value) == f"DAYZERO_{name.upper()}='{raw}': Input should be a finite number"


def test_the_float_settings_checked_include_the_timeouts_and_the_fraction():
    assert {"redis_answer_within_s", "kv_memory_fraction", "prefill_pass_s", "lease_s"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("url", ["sentinel://127.0.0.1:26379", "unix:///run/redis.sock", "127.0.0.1:6379"])
def test_a_redis_url_dayzero_cannot_serve_with_is_refused_at_start(monkeypatch, url):
    """redis-py (the gateway's and the stages' clients) reads no sentinel:// URL (kombu's form: no
    master named; dayzero's is redis+sentinel://), kombu (the broker) no unix://: ``dayzero up``
    started every process before one failed ("Redis URL must specify one of the following
    schemes"), and a unix:// broker failed in the workers (kombu)."""
    monkeypatch.setenv("DAYZERO_REDIS_URL", url)
    served = r"dayzero serves with a redis://, rediss:// \(TLS\) or redis\+sentinel://"
    with pytest.raises(ValueError, match=rf"^DAYZERO_REDIS_URL=.*: {served}"):
        settings_from_env()


def test_a_refused_redis_url_is_named_without_its_password(monkeypatch):
    """The refusal printed the value as given, a password in it (``sentinel://:secret@...``)."""
    monkeypatch.setenv("DAYZERO_REDIS_URL", "sentinel://admin:s3cret@10.0.0.2:26379/0")
    with pytest.raises(ValueError, match=r"^DAYZERO_REDIS_URL='sentinel://admin:\*\*\*@10\.0\.0\.2:26379/0': ") as err:
        settings_from_env()
    assert "s3cret" not in str(err.value)


def test_an_api_key_with_surrounding_spaces_is_refused(monkeypatch):
    monkeypatch.setenv("DAYZERO_API_KEYS", '["open", " sesame"]')
    with pytest.raises(ValueError, match="surrounding whitespace"):
        settings_from_env()


_NOT_ASCII = (
    r"^DAYZERO_API_KEYS=\*\*\*: key 1 has a character outside printable ASCII \(a tab, 'é'\), which clients send as"
    r" differing bytes \(curl: UTF-8\) or not at all \(httpx\); use printable ASCII$"
)


@pytest.mark.parametrize("key", ["clé", "tab\tkey", "sesame\u200b"])
def test_an_api_key_outside_printable_ascii_is_refused(monkeypatch, key):
    """A key beyond printable ASCII was accepted: httpx cannot send it as a header (``dayzero up
    --example`` died on a UnicodeEncodeError, stopping the whole stack), curl sends it as UTF-8. The
    refusal said HTTP clients cannot send it, which curl does: it says what they do, and the way out."""
    monkeypatch.setenv("DAYZERO_API_KEYS", f"open,{key}")
    with pytest.raises(ValueError, match=_NOT_ASCII):
        settings_from_env()


@pytest.mark.parametrize("raw", ['["open", " sesame"]', "open-sesame,", "open,clé"])
def test_a_refused_api_key_setting_shows_no_key(monkeypatch, raw):
    """The refusal printed the setting as given, every key in it, and the whitespace check the key
    itself (``key ' sesame' has surrounding whitespace``): an operator's terminal, a CI log."""
    monkeypatch.setenv("DAYZERO_API_KEYS", raw)
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert "sesame" not in str(error.value) and str(error.value).startswith("DAYZERO_API_KEYS"), error.value


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DAYZERO_DEVICE": "cuda:1", "DAYZERO_HANDOFF": "shm"},
            "DAYZERO_HANDOFF=shm moves CPU pools; with DAYZERO_DEVICE=cuda:1 use cuda_ipc (same GPU) or redis",
        ),
        ({"DAYZERO_HANDOFF": "cuda_ipc"}, "DAYZERO_HANDOFF=cuda_ipc needs DAYZERO_DEVICE=cuda, not cpu"),
        (
            {"DAYZERO_ATTENTION_BACKEND": "triton"},
            "DAYZERO_ATTENTION_BACKEND=triton compiles for a GPU: set DAYZERO_DEVICE=cuda, or use torch on CPU",
        ),
        (
            {"DAYZERO_MAX_PREFILL_TOKENS": "1024"},
            "DAYZERO_PREFILL_CHUNK_SIZE=2048 (its default) is larger than DAYZERO_MAX_PREFILL_TOKENS=1024, the "
            "tokens of a whole prefill step: set DAYZERO_PREFILL_CHUNK_SIZE to 1024 or less",
        ),
        (
            {"DAYZERO_PREFILL_CHUNK_SIZE": "600", "DAYZERO_MAX_PREFILL_TOKENS": "512"},
            "DAYZERO_PREFILL_CHUNK_SIZE=600 is larger than DAYZERO_MAX_PREFILL_TOKENS=512, the tokens of a whole "
            "prefill step: set DAYZERO_PREFILL_CHUNK_SIZE to 512 or less",
        ),
        *(
            (
                {"DAYZERO_DECODE_GRAPHS": "1", "DAYZERO_DEVICE": "cuda", "DAYZERO_HANDOFF": "redis", **more},
                "DAYZERO_DECODE_GRAPHS needs DAYZERO_ATTENTION_BACKEND=triton (on a GPU), one rank per worker "
                "and no speculative decoding",
            )
            for more in (
                {},
                {"DAYZERO_ATTENTION_BACKEND": "triton", "DAYZERO_TENSOR_PARALLEL": "2"},
                {"DAYZERO_ATTENTION_BACKEND": "triton", "DAYZERO_SPECULATIVE_TOKENS": "1"},
            )
        ),
    ],
)
def test_a_combination_that_cannot_work_names_its_variables(monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert str(error.value) == message


def test_the_handoff_follows_the_device_unless_set(monkeypatch):
    """A GPU's pools go by CUDA IPC unset (generate on a GPU was refused over a handoff it never makes)."""
    assert Settings().handoff == "shm" and Settings(device="cuda:1").handoff == "cuda_ipc"
    monkeypatch.setenv("DAYZERO_DEVICE", "cuda")
    assert settings_from_env().handoff == "cuda_ipc"
    monkeypatch.setenv("DAYZERO_HANDOFF", "redis")
    assert settings_from_env().handoff == "redis"


def test_a_cuda_device_the_host_lacks_is_refused(monkeypatch):
    import torch

    on_gpu = Settings(device="cuda:1", handoff="redis")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError) as error:
        on_gpu.require_device()
    assert str(error.value) == "DAYZERO_DEVICE=cuda:1 but CUDA is not available on this host"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError) as error:
        on_gpu.require_device()
    assert str(error.value) == "DAYZERO_DEVICE=cuda:1 but this host has 1 CUDA device(s)"
    Settings(device="cuda:0", handoff="redis").require_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("the CPU needs no CUDA"))
    Settings().require_device()


def test_a_list_the_settings_source_cannot_decode_is_one_line_naming_its_variable(monkeypatch):
    class WithNumbers(Settings):  # a list setting decoded by pydantic-settings itself (JSON only)
        numbers: list[int] = []

    monkeypatch.setattr(settings_help, "Settings", WithNumbers)
    monkeypatch.setenv("DAYZERO_NUMBERS", "1,2")
    with pytest.raises(ValueError) as error:
        settings_from_env()
    assert str(error.value) == "DAYZERO_NUMBERS could not be parsed: Extra data: line 1 column 2 (char 1)"


def test_a_triton_backend_without_a_gpu_is_refused():
    with pytest.raises(ValidationError, match="DAYZERO_ATTENTION_BACKEND=triton"):
        Settings(attention_backend="triton", device="cpu")
    assert Settings(attention_backend="triton", device="cuda", handoff="redis").attention_backend == "triton"


def test_a_browser_reconnect_arrives_inside_the_cancel_grace():
    settings = Settings()
    assert settings.disconnect_grace_s >= 5  # EventSource retries after ~3 s by default
    assert settings.sse_retry_ms < settings.disconnect_grace_s * 1000  # and sooner with our retry:


def test_a_kv_budget_given_in_bytes_is_refused_not_a_machine_out_of_memory(monkeypatch):
    """DAYZERO_KV_BUDGET_MB=8589934592 (8 GiB written in bytes): ``inspect`` (which now sizes the pools a
    worker allocates), ``up``'s check and a worker built the pools' block lists for 8 EiB: ``inspect
    deepseek-v4-flash`` grew past 9 GB of memory in a minute, where it had printed its plan in a second."""
    monkeypatch.setenv("DAYZERO_KV_BUDGET_MB", str(8 << 30))
    with pytest.raises(ValueError, match=r"^DAYZERO_KV_BUDGET_MB='8589934592': Input should be less than or equal to"):
        settings_from_env()
    assert Settings(kv_budget_mb=1 << 20).kv_budget_mb == 1 << 20  # 1 TiB: more than any one device holds


def test_a_decode_batch_past_what_was_tested_is_refused():
    with pytest.raises(ValidationError, match="max_batch"):
        Settings(max_batch=4097)
    assert Settings(max_batch=4096).max_batch == 4096


def test_a_variable_that_is_no_setting_is_named_with_the_likely_one():
    environ = {
        "DAYZERO_PROT": "9000",
        "DAYZERO_PORT": "1",
        "DAYZERO_CHECKPOINT_DIR": "/x",
        "DAYZERO_ZZZ": "",
        "HOME": "/",
    }
    assert unknown_settings(environ) == [
        "DAYZERO_PROT is not a setting (did you mean DAYZERO_PORT?)",
        "DAYZERO_ZZZ is not a setting",
    ]


def test_image_limits_come_from_their_variables(monkeypatch):
    monkeypatch.setenv("DAYZERO_IMAGE_MAX_TOTAL_PIXELS", "1234")
    monkeypatch.setenv("DAYZERO_IMAGE_MAX_PIXELS", "567")
    limits = Settings().image_limits()
    assert (limits.max_total_pixels, limits.max_pixels) == (1234, 567)


def test_a_per_image_limit_past_what_pillow_decodes_is_refused():
    """Pillow refuses an image of more than Image.MAX_IMAGE_PIXELS itself (a decompression bomb): a
    larger DAYZERO_IMAGE_MAX_PIXELS could never take effect."""
    from PIL import Image

    with pytest.raises(ValidationError, match="image_max_pixels"):
        Settings(image_max_pixels=Image.MAX_IMAGE_PIXELS + 1)
    assert Settings(image_max_pixels=Image.MAX_IMAGE_PIXELS).image_max_pixels == Image.MAX_IMAGE_PIXELS
