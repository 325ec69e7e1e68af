"""The official Python MCP SDK driving `conch mcp` over stdio (run by the Rust `cli` tests).

Usage: python client.py <path to the conch binary>

The part between the docs/mcp.md markers is that page's Python example, kept byte for byte
(a Rust test compares them); the checks after it run that example and then assert more.
"""

# docs/mcp.md:begin
import asyncio

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(command: str = "conch") -> None:
    server = StdioServerParameters(command=command, args=["mcp", "--composition", "standard"])
    notices: asyncio.Queue = asyncio.Queue()

    async def on_log(params):  # background job completions arrive as log messages
        await notices.put(params.data)

    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, logging_callback=on_log) as session:
            await session.initialize()
            tools = await session.list_tools()
            print([tool.name for tool in tools.tools])
            result = await session.call_tool("bash", {"command": "echo hello; exit 3"})
            print(result.content[0].text)  # hello, then [exit code: 3]
            job = await session.call_tool(
                "bash", {"command": "echo from the background", "run_in_background": True}
            )
            print(job.structured_content["job_id"])  # bash-1
            print((await notices.get())["text"])  # job bash-1 (...) completed
# docs/mcp.md:end


# The checks below are the test; the example above is run first, as a user would.
import contextlib  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import jsonschema  # noqa: E402  (a dependency of mcp)

# Every wait is for an event, bounded generously (a loaded 2-core machine).
LIMIT = 60.0


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


async def run_example(conch: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        await asyncio.wait_for(main(conch), LIMIT)
    lines = out.getvalue().splitlines()
    expect(
        lines
        == [
            "['bash', 'file_read', 'file_write', 'file_edit', 'file_list', 'job_output', "
            "'job_list', 'job_kill']",
            "hello",
            "[exit code: 3]",
            "bash-1",
            "job bash-1 (echo from the background) completed",
        ],
        f"the docs/mcp.md example printed {lines!r}",
    )


async def run_checks(conch: str) -> None:
    server = StdioServerParameters(command=conch, args=["mcp", "--composition", "standard"])
    notices: asyncio.Queue = asyncio.Queue()

    async def on_log(params) -> None:
        await notices.put(params)

    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write, logging_callback=on_log) as session:
            init = await session.initialize()
            expect(init.server_info.name == "conch", f"server info: {init.server_info}")

            # Every tool has an input schema that is a valid JSON Schema for an object.
            tools = (await session.list_tools()).tools
            expect(len(tools) == 8, f"tools: {[t.name for t in tools]}")
            for tool in tools:
                schema = tool.input_schema
                jsonschema.validators.validator_for(schema).check_schema(schema)
                expect(schema.get("type") == "object", f"{tool.name}: {schema}")
                expect(bool(tool.description), f"{tool.name} has a description")
            bash = next(t for t in tools if t.name == "bash")
            jsonschema.validate({"command": "true"}, bash.input_schema)

            # A tool error is a result with isError and the stable code.
            bad = await session.call_tool("bash", {"comand": "true"})
            expect(bad.is_error is True, f"bad arguments: {bad}")
            expect(bad.content[0].text.startswith("error[invalid_argument]: "), f"{bad}")

            # Progress arrives while the call runs; the call ends when the test opens a gate.
            with tempfile.TemporaryDirectory() as tmp:
                gate = os.path.join(tmp, "gate")
                seen: list[float] = []

                async def on_progress(progress, total, message) -> None:
                    seen.append(progress)
                    if len(seen) == 2:
                        open(gate, "w").close()

                result = await asyncio.wait_for(
                    session.call_tool(
                        "bash",
                        {"command": f"while [ ! -e {gate} ]; do sleep 0.02; done; echo opened"},
                        progress_callback=on_progress,
                    ),
                    LIMIT,
                )
            expect(result.content[0].text == "opened\n", f"gated call: {result}")
            expect(len(seen) >= 2 and seen == sorted(set(seen)), f"progress grows: {seen}")

            # A background job's completion: a log message now, a notice on the next result.
            job = await session.call_tool(
                "bash", {"command": "echo bg; exit 4", "run_in_background": True}
            )
            job_id = job.structured_content["job_id"]
            log = await asyncio.wait_for(notices.get(), LIMIT)
            expect(log.level == "notice" and log.logger == "conch.jobs", f"log: {log}")
            expect(log.data["source_id"] == job_id, f"log: {log}")
            expect(log.data["text"].endswith("completed: exit code: 4"), f"log: {log}")
            # The next result to be sent carries it: the start's own, when the job beat it.
            after = await session.call_tool("bash", {"command": "true"})
            carried = [
                r for r in (job, after) if f"[notice] {log.data['text']}" in [c.text for c in r.content]
            ]
            expect(len(carried) == 1, f"carried once: {job.content} {after.content}")


async def run(conch: str) -> None:
    await run_example(conch)
    await run_checks(conch)


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1]))
    print("PASS")
