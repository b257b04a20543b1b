import pytest
import torch

from ebmlab import threads


def test_the_usable_cpus_follow_affinity_and_the_cgroup_quota(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    assert threads.usable_cpus() == 4
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 1.5)  # 150 ms per 100 ms period
    assert threads.usable_cpus() == 2


def test_a_cgroup_v2_quota_is_read(monkeypatch, tmp_path):
    files = {"/sys/fs/cgroup/cpu.max": "250000 100000\n"}

    class FakePath:
        def __init__(self, path):
            self.path = str(path)

        def __truediv__(self, other):
            return FakePath(f"{self.path}/{other}")

        def read_text(self):
            if self.path not in files:
                raise OSError(self.path)
            return files[self.path]

    monkeypatch.setattr(threads, "Path", FakePath)
    assert threads._cgroup_quota() == 2.5
    files["/sys/fs/cgroup/cpu.max"] = "max 100000\n"
    assert threads._cgroup_quota() is None


def test_the_default_is_torchs_count_capped_at_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(threads, "usable_cpus", lambda: 1)
    assert threads.resolve_threads(0) == 1
    assert threads.resolve_threads(1) == 1
    with pytest.raises(ValueError, match="--threads 2 is more than the 1 CPUs"):
        threads.resolve_threads(2, "--threads")
    with pytest.raises(ValueError, match="integer >= 0"):
        threads.resolve_threads(-1)


def test_apply_threads_sets_torch_only_where_it_differs(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "usable_cpus", lambda: max(2, before))
        assert threads.apply_threads(1) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_busy_machine_gets_a_hint(monkeypatch):
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 6.3)
    assert "load average 6.3 on 2 CPUs" in threads.busy_warning(2)
    assert "--threads 1" in threads.busy_warning(2)
    assert "--threads" not in threads.busy_warning(1)
    monkeypatch.setattr(threads, "load_average", lambda: 2.4)  # a job just ended
    assert threads.busy_warning(2) is None
