#!/usr/bin/env python3
"""An asyncio echo server (one argument: the port). Each connection is
echoed until EOF; after `--conns N` connections it exits normally."""
import asyncio
import sys

port = int(sys.argv[1])
limit = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--conns" else 10**9
done = 0


async def echo(reader, writer):
    global done
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()
    await writer.wait_closed()
    done += 1
    if done >= limit:
        finished.set()


async def main():
    global finished
    finished = asyncio.Event()
    server = await asyncio.start_server(echo, "127.0.0.1", port)
    async with server:
        await finished.wait()


asyncio.run(main())
