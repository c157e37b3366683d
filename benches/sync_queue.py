#!/usr/bin/env python3
"""How a background writer's writeback delays a log's fdatasync.

One thread appends 300-byte records to a pre-allocated file, each followed
by fdatasync (a log's create, reduced to its sync), while a second thread
writes 32 MB files in one of several ways; prints the p50 and p99 of the
first thread's write + fdatasync for each, side by side in one run.

    python3 benches/sync_queue.py [DIR]   # DIR on the disk to measure (default ./sync-queue-scratch)

The figures and what they decided (the compaction's `WritePace`) are in
docs/performance/erasure.md. Linux only (sync_file_range through ctypes).
"""
import ctypes
import os
import shutil
import sys
import threading
import time

LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4
FILE_BYTES = 32 << 20
SECONDS = 4


def write_back(fd, offset, length):
    LIBC.sync_file_range(ctypes.c_int(fd), ctypes.c_longlong(offset),
                         ctypes.c_longlong(length),
                         ctypes.c_uint(WAIT_BEFORE | WRITE | WAIT_AFTER))


def appender(directory, stop, latencies):
    path = os.path.join(directory, "log")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
    os.write(fd, b"\0" * (64 << 20))  # zero fill ahead, as the engine does
    os.fsync(fd)
    offset, record = 0, b"x" * 300
    while not stop.is_set():
        started = time.perf_counter()
        os.pwrite(fd, record, offset)
        os.fdatasync(fd)
        latencies.append(time.perf_counter() - started)
        offset += len(record)
    os.close(fd)


def background(directory, way, stop):
    """way: None, "burst", or (step_bytes, bytes_per_s or None)."""
    data = os.urandom(1 << 20)
    n = 0
    while not stop.is_set():
        path = os.path.join(directory, f"bg{n % 2}")
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
        if way == "burst":
            for k in range(FILE_BYTES >> 20):
                os.pwrite(fd, data, k << 20)
        else:
            step, rate = way
            started = time.perf_counter()
            for k in range(FILE_BYTES // step):
                os.pwrite(fd, data[:step], k * step)
                write_back(fd, k * step, step)
                if rate:
                    wait = started + (k + 1) * step / rate - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                if stop.is_set():
                    break
        os.fsync(fd)
        os.close(fd)
        n += 1


def run(directory, way):
    stop, latencies = threading.Event(), []
    threads = [threading.Thread(target=appender, args=(directory, stop, latencies))]
    if way is not None:
        threads.append(threading.Thread(target=background, args=(directory, way, stop)))
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join()
    latencies.sort()
    n = len(latencies)
    return n, latencies[n // 2] * 1e3, latencies[int(n * 0.99)] * 1e3


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "sync-queue-scratch"
    os.makedirs(directory, exist_ok=True)
    ways = [
        ("nothing", None),
        ("32 MB written, then fsync", "burst"),
        ("1 MiB steps, written back, full speed", (1 << 20, None)),
        ("64 KiB steps, written back, full speed", (64 << 10, None)),
        ("64 KiB steps at 16 MB/s", (64 << 10, 16e6)),
        ("64 KiB steps at 8 MB/s", (64 << 10, 8e6)),
        ("64 KiB steps at 4 MB/s", (64 << 10, 4e6)),
    ]
    try:
        for _ in range(2):
            for name, way in ways:
                n, p50, p99 = run(directory, way)
                print(f"{name:42} {n:7} syncs  p50 {p50:6.3f} ms  p99 {p99:6.3f} ms", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
