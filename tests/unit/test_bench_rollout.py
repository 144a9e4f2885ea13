"""The rollout bench's figure: the rollout's wall time over the time the machines were away."""

from bench.rollout import away_seconds, node_phases

TIMES = [(0.0, "127.0.30.11", 0.1, 10.2, 18.0), (18.5, "127.0.30.12", 18.6, 28.7, 36.0)]


def test_machines_away_is_reboot_to_node_ready_summed():
    assert away_seconds(TIMES) == (18.0 - 0.1) + (36.0 - 18.6)


def test_a_node_without_its_node_ready_leaves_the_figure_unmeasured():
    assert away_seconds([*TIMES, (40.0, "127.0.30.13", 40.1, 50.0, None)]) is None
    assert away_seconds([]) is None


def test_phases_per_node_end_with_the_gap_to_the_next_apply():
    assert node_phases(TIMES) == [["127.0.30.11", "0.1 s", "10.1 s", "7.8 s", "0.5 s"],
                                  ["127.0.30.12", "0.1 s", "10.1 s", "7.3 s", "–"]]
