"""Conversion worker processes: `python -m coordinator.uniform` (`main` below), each running `conversion.convert` on the
jobs the service sends it, so that a conversion's CPU never holds the service's event loop (or its GIL).

The service (`Workers`) writes a job to the worker's stdin and reads the outcome from its stdout, each one msgpack
frame after a 4-byte length. A worker imports nothing of the program that started the service (unlike
multiprocessing's spawn, which runs the parent's main module again), runs niced so that the service and its
database keep the CPU they need, and ends when its stdin closes: when the service stops or dies. Whatever a job
raises is answered, a compiled extension's panic included (pyo3's PanicException is a BaseException); a worker
that ends mid-job all the same (a crash of native code, the kernel's OOM killer) is replaced (`WorkerEnded`).
"""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys
from typing import Any, BinaryIO

import msgpack
import trio

from .conversion import Converted, Job, Refused, convert, extension_panic, failure

HEADER = struct.Struct(">I")
NICENESS = 10


def _pack(value: Any) -> bytes:
    payload = msgpack.packb(value, use_bin_type=True)
    return HEADER.pack(len(payload)) + payload


def _unpack(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


class WorkerEnded(EOFError):
    """The worker process ended before it answered its job."""


def _outcome(value: dict) -> Converted | Refused:
    if "error" in value:
        raise RuntimeError(f"the conversion worker failed: {value['error']}")
    if "reason" in value:
        return Refused(**value)
    value["files"] = [tuple(f) for f in value["files"]]
    return Converted(**value)


class Workers:
    """Up to `size` worker processes, started when first needed and reused; one job at a time each."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._slots = trio.Semaphore(self.size)
        self._idle: list[trio.Process] = []

    async def run(self, job: Job) -> Converted | Refused:
        async with self._slots:
            process = self._idle.pop() if self._idle else await self._start()
            try:
                await process.stdin.send_all(_pack(dataclasses.asdict(job)))
                value = _unpack(await _receive(process.stdout))
            except (EOFError, trio.BrokenResourceError):
                try:
                    with trio.move_on_after(1):   # (its own end, not our kill, is what its status tells)
                        await process.wait()
                finally:
                    process.kill()
                raise WorkerEnded(f"the conversion worker ended before answering, {_status(process.returncode)}") \
                    from None
            except BaseException:
                process.kill()   # cancelled mid-job: it is not reused
                raise
            self._idle.append(process)
        return _outcome(value)

    async def _start(self) -> trio.Process:
        return await trio.lowlevel.open_process([sys.executable, "-m", "coordinator.uniform"],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def close(self) -> None:
        for process in self._idle:
            process.kill()
        self._idle.clear()


async def _receive(stream) -> bytes:
    """One frame's payload; EOFError if the worker ended first."""
    data = bytearray()
    size = None
    while size is None or len(data) < size:
        chunk = await stream.receive_some(1 << 20)
        if not chunk:
            raise EOFError("the conversion worker ended before answering")
        data += chunk
        if size is None and len(data) >= HEADER.size:
            size = HEADER.size + HEADER.unpack_from(data)[0]
    return bytes(data[HEADER.size:])


def _status(returncode: int | None) -> str:
    if returncode is None:
        return "and was killed (it had closed its output)"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _read(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def main() -> None:
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    jobs, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr   # nothing else may write into the answers' stream
    while True:
        header = _read(jobs, HEADER.size)
        if header is None:
            return   # the service closed our stdin: it stopped, or died
        payload = _read(jobs, HEADER.unpack(header)[0])
        if payload is None:
            return
        answers.write(_pack(_answer(payload)))
        answers.flush()


def _answer(payload: bytes) -> dict:
    """The outcome of one job, or the error that stopped it (the service retries it later): what `convert` does not
    refuse itself is the storage's or the machine's."""
    try:
        return dataclasses.asdict(convert(Job(**_unpack(payload))))
    except Exception as exc:
        return {"error": failure(exc)}
    except BaseException as exc:
        if not extension_panic(exc):
            raise
        return {"error": failure(exc)}

