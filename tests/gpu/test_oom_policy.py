"""Out-of-memory deaths are not restarted into the same failure.

The runtime here is a script that prints llama.cpp b11434's CUDA out-of-memory
sequence and exits 1, as llama-server does when cudaMalloc fails: a CUDA GPU cannot
run on these machines, and the daemon only ever sees the output and the exit status.
"""

from __future__ import annotations

import stat
from pathlib import Path

from supervisor.gpu import oom
from tests.conftest import llama_target, write_fleet

CUDA_OOM = """\
ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: out of memory
alloc_tensor_range: failed to allocate CUDA0 buffer of size 9437184000
llama_model_load: error loading model: unable to allocate CUDA0 buffer
llama_model_load_from_file_impl: failed to load model
srv    load_model: failed to load model, '/models/big.gguf'
srv    operator(): operator(): cleaning up before exit...
main: exiting due to model loading error
"""


# It answers --help as the real build does: every flag specfleet gives is checked against it.
HELP = Path(__file__).resolve().parents[1] / "fixtures" / "llama-server-b11434-help.txt"


def fake_server(tmp_path):
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n"
                      f'case "$1" in --help) cat {HELP}; exit 0;; '
                      '--version) echo "version: 11434 (cuda-oom-fixture)"; exit 0;; esac\n'
                      f"echo 'started' >> {tmp_path}/starts\n"
                      f"cat >&2 <<'EOF'\n{CUDA_OOM}EOF\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_a_cuda_out_of_memory_death_is_given_up_after_at_most_one_retry(
        tmp_path, model, start_daemon):
    daemon = start_daemon(write_fleet(tmp_path, {"big": llama_target(model,
                                                                     str(fake_server(tmp_path)))}))
    failed = daemon.wait_state("big", "failed", 30)
    assert (tmp_path / "starts").read_text().count("started") == 2  # the first start + 1 retry
    assert failed["restarts"] == 1
    reasons = [e["reason"] for e in daemon.events("big") if e["kind"] == "state"
               and e["new"] in ("backoff", "failed")]
    assert len(reasons) == 2
    assert "one restart after out of memory (the VRAM planner cannot check without GPU " \
           "readings)" in reasons[0]
    assert reasons[1].startswith("out of memory: cudaMalloc failed: out of memory")
    assert "out of memory 2 times within 10m00s: not restarting into the same failure" \
        in reasons[1]
    assert "cudaMalloc failed" in failed["failure_output"]  # the runtime's own words
    assert daemon.proc.poll() is None  # the daemon itself carries on


def test_the_kernel_oom_killer_is_read_from_the_cgroup_memory_events():
    events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
    assert oom.parse_memory_events(events)["oom_kill"] == 2
    assert oom.search("terminate called after throwing an instance of 'std::bad_alloc'") \
        == "std::bad_alloc"
    assert oom.search("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
                      ) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert oom.search("Segmentation fault") is None
