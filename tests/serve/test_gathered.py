"""How the Refiner merges its requests' encoder calls (``Gathered``), on a plain event loop."""

import asyncio

import pytest

from canopy_ray.serve.deployments import Gathered

HOUR = 3600.0  # a wait bound no test may reach


class Runs:
    """A ``run`` that records each batch it is given."""

    def __init__(self, fail: bool = False):
        self.batches: list[tuple[str, list]] = []
        self.fail = fail

    def __call__(self, kind: str, calls: list) -> list:
        self.batches.append((kind, list(calls)))
        if self.fail:
            raise RuntimeError("the model failed")
        return [f"{kind}:{c}" for c in calls]


def run(coro, limit: float = 5.0):
    return asyncio.run(asyncio.wait_for(coro, limit))


def test_a_lone_request_waits_for_nothing():
    runs = Runs()
    gathered = Gathered(runs, wait_s=HOUR)

    async def one():
        with gathered.working():
            return [await gathered.call("nodes", "a"), await gathered.call("nodes", "b")]

    assert run(one()) == ["nodes:a", "nodes:b"]
    assert runs.batches == [("nodes", ["a"]), ("nodes", ["b"])]


def test_calls_wait_for_every_busy_request_then_run_as_one_batch_per_kind():
    runs = Runs()
    gathered = Gathered(runs, wait_s=HOUR)

    async def main():
        begun, busy = asyncio.Event(), asyncio.Event()

        async def request(name: str, kind: str, first: asyncio.Event | None = None):
            with gathered.working():
                await begun.wait()  # all three requests are in the replica
                if first is not None:
                    await first.wait()  # busy elsewhere (not in a call) until released
                return await gathered.call(kind, name)

        tasks = [asyncio.create_task(request("a", "nodes")), asyncio.create_task(request("b", "query")),
                 asyncio.create_task(request("c", "nodes", busy))]
        await asyncio.sleep(0.01)
        begun.set()
        await asyncio.sleep(0.05)
        assert runs.batches == []  # a and b wait while c works
        busy.set()
        return await asyncio.gather(*tasks)

    assert run(main()) == ["nodes:a", "query:b", "nodes:c"]
    assert sorted(runs.batches) == [("nodes", ["a", "c"]), ("query", ["b"])]


def test_a_request_that_finishes_releases_those_waiting_for_it():
    runs = Runs()
    gathered = Gathered(runs, wait_s=HOUR)

    async def main():
        done = asyncio.Event()

        async def other():
            with gathered.working():
                await done.wait()  # it never calls the encoder

        async def caller():
            with gathered.working():
                return await gathered.call("nodes", "a")

        rest = asyncio.create_task(other())
        waiting = asyncio.create_task(caller())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        done.set()
        await rest
        return await waiting

    assert run(main()) == "nodes:a"


def test_the_wait_for_a_busy_request_is_bounded():
    runs = Runs()
    gathered = Gathered(runs, wait_s=0.05)

    async def main():
        stuck = asyncio.Event()

        async def other():
            with gathered.working():
                await stuck.wait()

        async def caller():
            with gathered.working():
                return await gathered.call("nodes", "a")

        rest = asyncio.create_task(other())
        out = await caller()
        rest.cancel()
        return out

    assert run(main(), limit=2.0) == "nodes:a"
    assert runs.batches == [("nodes", ["a"])]


def test_a_failed_batch_fails_each_of_its_calls():
    runs = Runs(fail=True)
    gathered = Gathered(runs, wait_s=HOUR)

    async def main():
        begun = asyncio.Event()

        async def request(name):
            with gathered.working():
                await begun.wait()
                return await gathered.call("nodes", name)

        tasks = [asyncio.create_task(request(n)) for n in "ab"]
        await asyncio.sleep(0.01)
        begun.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    outs = run(main())
    assert runs.batches == [("nodes", ["a", "b"])]  # one batch, both calls failed
    assert [type(e) for e in outs] == [RuntimeError, RuntimeError]


def test_two_calls_of_one_request_count_as_one_request_waiting():
    runs = Runs()
    gathered = Gathered(runs, wait_s=HOUR)

    async def main():
        begun, busy = asyncio.Event(), asyncio.Event()

        async def pair():  # nodes and cross-encoder pairs at once, as the hybrid with a scorer asks
            with gathered.working():
                await begun.wait()
                return await asyncio.gather(gathered.call("nodes", "a"), gathered.call("pairs", "a"))

        async def other():
            with gathered.working():
                await begun.wait()
                await busy.wait()
                return await gathered.call("nodes", "b")

        tasks = [asyncio.create_task(pair()), asyncio.create_task(other())]
        await asyncio.sleep(0.01)
        begun.set()
        await asyncio.sleep(0.05)
        assert runs.batches == []  # two calls pending, but one of the two requests still works
        busy.set()
        return await asyncio.gather(*tasks)

    assert run(main()) == [["nodes:a", "pairs:a"], "nodes:b"]
    assert sorted(runs.batches) == [("nodes", ["a", "b"]), ("pairs", ["a"])]


def test_a_cancelled_call_is_not_run():
    runs = Runs()
    gathered = Gathered(runs, wait_s=HOUR)

    async def main():
        begun, busy = asyncio.Event(), asyncio.Event()

        async def request(name, wait=None):
            with gathered.working():
                await begun.wait()
                if wait is not None:
                    await wait.wait()
                return await gathered.call("nodes", name)

        tasks = {n: asyncio.create_task(request(n)) for n in "ab"} | {"c": asyncio.create_task(request("c", busy))}
        await asyncio.sleep(0.01)
        begun.set()
        await asyncio.sleep(0.05)  # a and b wait for c
        tasks["a"].cancel()  # a client went away while its call waited
        gathered.flush()  # before a's task has run again: its call is still pending, its future cancelled
        with pytest.raises(asyncio.CancelledError):
            await tasks["a"]
        busy.set()
        return await tasks["b"], await tasks["c"]

    assert run(main()) == ("nodes:b", "nodes:c")
    assert runs.batches == [("nodes", ["b"]), ("nodes", ["c"])]
