"""Each phase's peak resident memory: a phase that touches 256 MB shows it, the next one does not, and a
nested phase's peak counts in its parent's."""
import pytest

from vcppo.driver.step.timeline import PeakRss, PhaseTimer

MB = 2 ** 20


def _touch(n_bytes: int) -> bytes:
    return b"\x01" * n_bytes  # written, so resident


@pytest.fixture
def rss():
    probe = PeakRss()
    if not probe.available:
        pytest.skip("this /proc cannot reset the peak resident memory")
    return probe


def test_each_phase_has_its_own_peak(rss):
    timer = PhaseTimer(rss=rss)
    with timer("big"):
        block = _touch(256 * MB)
        del block
    with timer("small"):
        _touch(MB)
    m = timer.metrics()
    big, small = m["perf/rss_peak_gb/big"], m["perf/rss_peak_gb/small"]
    assert big - small > 200 / 1024, (big, small)


def test_a_nested_phase_peak_counts_in_its_parent(rss):
    timer = PhaseTimer(rss=rss)
    with timer("outer"):
        with timer("inner"):
            block = _touch(256 * MB)
            del block
        with timer("after"):
            _touch(MB)
    peaks = timer.peak_bytes
    assert peaks["outer"] >= peaks["inner"] > peaks["after"] + 200 * MB


def test_without_a_probe_nothing_is_measured():
    timer = PhaseTimer()
    with timer("phase"):
        pass
    assert not any(k.startswith("perf/rss_peak_gb") for k in timer.metrics())
