"""Who reached a collective last: the one home of arrival order at collectives (docs/FIGURES.md "Slow steps").

A collective instance is one (step, collective name, occurrence in the step).
Every rank is released by the last arrival. Where the producer wrote the
wait's ``peer`` attribute, that is the last rank. Otherwise arrival order is
read on the host axis where the device clock is **aligned** with it (every rank
left after the last one arrived, within :data:`ALIGNMENT_TOLERANCE_NS`); a rank
that stayed in the collective after the release (its thread stalled) is then
not mistaken for one that waited for a late peer. Where it is not aligned, all
ranks are taken to leave together, so a rank that waited w less arrived w
later. Either way ``ahead_ns`` says how long before the last arrival a rank
arrived, and the last rank is the one least ahead (ties: the lowest rank).

The slow steps' critical path, the causes and the what-if replay read this.
"""

from __future__ import annotations

from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine

# a rank's exit from a collective this long before the last arrival still counts as after it (clock noise)
ALIGNMENT_TOLERANCE_NS = 50_000
# how the last rank was known: the producer's ``peer`` attribute, or the arrival order
SOURCE_PEER = "peer"
SOURCE_ARRIVAL = "arrival order"


def arrived_last(rank: str, ahead: str) -> str:
    """SQL aggregate: the ``rank`` that arrived last, the one least ``ahead`` of the last arrival (ties: the lowest rank)."""
    return f"arg_min({rank}, ({ahead}, {rank}))"


@stage("collectives", reads=("decode",), writes=("collectives",))
def collective_instances(engine: Engine) -> None:
    """``collectives``: every rank's wait at every collective instance, with the instance's last arrival and last rank."""
    # occurrence: the wait's place among the same collective's waits in its rank's step (in start order)
    engine.run("""CREATE OR REPLACE TEMP TABLE arrivals AS
        SELECT *, CAST(row_number() OVER (PARTITION BY step, rank, name ORDER BY offset_ns, wait_index) AS BIGINT) AS occurrence
        FROM (SELECT step, rank, CAST(i - 1 AS BIGINT) AS wait_index, w.name, w.ts_ns AS offset_ns,
                     CAST(runner_ts_ns AS HUGEINT) + w.ts_ns AS arrival_ns, w.dur_ns AS wait_ns, w.peer
              FROM (SELECT step, rank, runner_ts_ns, unnest(device_waits) AS w, generate_subscripts(device_waits, 1) AS i
                    FROM decode WHERE device_waits IS NOT NULL))""")
    # the last rank is the one least ahead of the last arrival: on the host axis the latest, else the one that waited least
    aligned = f"min(arrival_ns + wait_ns) >= max(arrival_ns) - {ALIGNMENT_TOLERANCE_NS}"
    engine.run(f"""CREATE OR REPLACE TEMP TABLE instances AS
        SELECT step, name, occurrence, {aligned} AS aligned, max(arrival_ns) AS last_arrival_ns,
               min(arrival_ns + wait_ns) AS first_exit_ns, min(wait_ns) AS least_wait_ns,
               coalesce(mode(peer), CASE WHEN {aligned} THEN {arrived_last("rank", "-arrival_ns")}
                                         ELSE {arrived_last("rank", "wait_ns")} END) AS last_rank,
               CASE WHEN count(peer) > 0 THEN '{SOURCE_PEER}' ELSE '{SOURCE_ARRIVAL}' END AS source
        FROM arrivals GROUP BY step, name, occurrence""")
    engine.run("""CREATE OR REPLACE TABLE collectives AS
        SELECT a.step, a.name, a.occurrence, a.rank, a.wait_index, a.arrival_ns, a.wait_ns,
               a.arrival_ns + a.wait_ns AS exit_ns, a.peer, i.aligned, i.last_arrival_ns, i.first_exit_ns,
               CAST(CASE WHEN i.aligned THEN i.last_arrival_ns - a.arrival_ns ELSE a.wait_ns - i.least_wait_ns END AS HUGEINT) AS ahead_ns,
               i.last_rank, i.source
        FROM arrivals a JOIN instances i USING (step, name, occurrence)""")
