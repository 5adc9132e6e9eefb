"""`HeartbeatRounds`, the leadership check of ReadIndex reads: once more answers of this
term than AppendEntries of this term sent at a read's mark have come from a partner, that
partner accepted the leader's term after the mark. What is never answered (AppendEntries
of an earlier term, in flight on a connection that closed) must not hold a partner's
answers below its sends for good: that used to fail every linearizable read after a healed
partition (chaos seeds 20261123 and 4242)."""

from __future__ import annotations

from raft._pysyncobj_glue import HeartbeatRounds


def _confirmed(rounds: HeartbeatRounds, mark: dict[str, int], majority: int = 2) -> bool:
    return 1 + rounds.answered_since(mark) >= majority


def test_a_read_needs_an_answer_to_a_send_made_after_its_mark() -> None:
    rounds = HeartbeatRounds()
    for _ in range(3):
        rounds.sent("b", 5)
    rounds.answered("b", 5)
    mark = rounds.mark()
    # Answers to the two sent before the mark prove nothing about after it.
    rounds.answered("b", 5)
    rounds.answered("b", 5)
    assert not _confirmed(rounds, mark)
    rounds.sent("b", 5)
    rounds.answered("b", 5)
    assert _confirmed(rounds, mark)


def test_sends_of_an_earlier_term_never_answered_do_not_block_the_next_term() -> None:
    rounds = HeartbeatRounds()
    # Term 12: 500 AppendEntries to b and c that their next term made stale (no answers).
    for _ in range(500):
        rounds.sent("b", 12)
        rounds.sent("c", 12)
    # Term 15, this node leads again: one round, answered.
    rounds.sent("b", 15)
    rounds.sent("c", 15)
    mark = rounds.mark()
    rounds.sent("b", 15)
    rounds.answered("b", 15)
    rounds.answered("b", 15)
    assert _confirmed(rounds, mark)


def test_answers_stamped_with_another_term_are_not_counted() -> None:
    rounds = HeartbeatRounds()
    rounds.sent("b", 7)
    mark = rounds.mark()
    rounds.sent("b", 7)
    rounds.answered("b", 6)  # a late answer to an AppendEntries of an older leadership
    rounds.answered("b", 6)
    assert not _confirmed(rounds, mark)
    rounds.answered("b", 7)
    rounds.answered("b", 7)
    assert _confirmed(rounds, mark)
    # An unstamped answer (a node without the stamp) counts as one of the current term.
    rounds.sent("c", 7)
    mark = rounds.mark()
    rounds.sent("c", 7)
    rounds.answered("c", None)
    rounds.answered("c", None)
    assert rounds.answered_since(mark) >= 1


def test_what_was_in_flight_on_a_lost_connection_is_forgotten() -> None:
    rounds = HeartbeatRounds()
    for _ in range(400):  # queued on a connection that then timed out, never answered
        rounds.sent("b", 3)
        rounds.sent("c", 3)
    rounds.answered("b", 3)
    mark = rounds.mark()
    for _ in range(10):  # heartbeats after the partners came back, all answered
        rounds.sent("b", 3)
        rounds.answered("b", 3)
    assert not _confirmed(rounds, mark), "lost sends hold the answers below the mark"
    rounds.connection_lost("b")
    mark = rounds.mark()
    rounds.sent("b", 3)
    rounds.answered("b", 3)
    assert _confirmed(rounds, mark)
