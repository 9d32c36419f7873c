"""Processes are built by factories from a settings object; importing builds nothing."""

from __future__ import annotations

from ..conftest import fresh_python


def test_the_gateway_process_imports_neither_torch_nor_triton():
    out = fresh_python(  # what ``dayzero serve gateway`` imports: the command line, then the app
        "import sys\n"
        "import dayzero.cli\n"
        "from services.gateway.app import make_app\n"
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    assert out.strip() == "[]"


def test_importing_a_worker_module_builds_no_app_and_reads_no_settings():
    out = fresh_python(
        "import os, sys\n"
        "os.environ['DAYZERO_PORT'] = 'not a port'  # a Settings() at import would fail on this\n"
        "import services.prefill.worker, services.decode.worker, services.vision.worker\n"
        "from celery import Celery\n"
        "mods = (services.prefill.worker, services.decode.worker, services.vision.worker)\n"
        "print([n for m in mods for n, v in vars(m).items() if isinstance(v, Celery)])"
    )
    assert out.strip() == "[]"


def test_the_vision_process_imports_neither_the_language_model_nor_numba():
    """What ``dayzero serve vision`` imports: the command line, then its worker module. It encodes images
    and parks their embeddings, with no attention state, yet it imported dayzero.kv (serving.worker ->
    kv.shared for its SIGTERM unlink; serving.handoff, where the parking lived beside the KV handoff, ->
    kv.handoff -> kv.host_copy) and with it numba: ~0.3 s of CPU each start. (One interpreter for both
    lists: each fresh one costs ~4 s of the test run.)"""
    out = fresh_python(
        "import sys\n"
        "import dayzero.cli\n"
        "import services.vision.worker\n"
        "heavy = ('triton', 'dayzero.model.forward', 'dayzero.kernels', 'dayzero.serving.runtime', 'numba', 'llvmlite',"
        " 'dayzero.kv')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    assert out.strip() == "[]"
