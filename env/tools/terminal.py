"""run_terminal_cmd: one command line in the episode's sandbox, in the template of docs/tools.md.

The sandbox (`ctx.sandbox`, an env.sandbox.Sandbox or anything with the same `.shell` and
`.start_background`) keeps the shell's working directory between calls; the parallel calls of one turn
run concurrently, each starting in the shell's current directory. A command's exit status does not set the
error flag (a failing test run is a normal result); a timed-out command does not either: its partial
output is the result. The error flag marks calls that ran nothing: no sandbox, a command with a newline
or a NUL character.

Output is capped at 20000 characters: the first and last 10000 are kept around a
`... {n} characters truncated ...` line (a test run's summary is at the end, its first failure near the
start).
"""

from env.tools.context import ToolContext, ToolError, ToolResult

MAX_OUTPUT_CHARS = 20_000


def cap_output(output: str) -> str:
    """`output` cut to MAX_OUTPUT_CHARS characters, keeping its head and its tail."""
    if len(output) <= MAX_OUTPUT_CHARS:
        return output
    half = MAX_OUTPUT_CHARS // 2
    return f"{output[:half]}\n... {len(output) - 2 * half} characters truncated ...\n{output[-half:]}"


def _block(command: str, output: str) -> str:
    output = cap_output(output)
    if output.endswith("\n"):
        output = output[:-1]
    return f"```\n{command}\n{output}\n```" if output else f"```\n{command}\n```"


def format_completed(command: str, exit_code: int | None, output: str, cwd: str) -> str:
    """The result text of a command that ended."""
    code = "unknown" if exit_code is None else exit_code
    return (
        f"Exit code: {code}\n\nCommand output:\n\n{_block(command, output)}\n\nCommand completed.\n\n"
        "The previous shell command ended, so on the next invocation of this tool, you will be reusing the "
        f"shell.\n\nOn the next terminal tool call, the directory of the shell will already be {cwd}."
    )


def format_timed_out(command: str, output: str, cwd: str) -> str:
    """The result text of a command stopped at its timeout: the partial output it wrote."""
    return (
        f"Command timed out.\n\nCommand output:\n\n{_block(command, output)}\n\n"
        f"On the next terminal tool call, the directory of the shell will already be {cwd}."
    )


def format_background(shell_id, pid: int, output_path: str) -> str:
    """The result text of a command started in the background."""
    return (
        f"Background command started successfully.\n\nShell ID: {shell_id}\nPID: {pid}\n"
        f"Output file: {output_path}"
    )


def run_terminal_cmd(ctx: ToolContext, args: dict) -> ToolResult:
    command = args["command"]
    if "\n" in command or "\r" in command:
        raise ToolError("Error: the command must be a single line (no newlines); join commands with && or ;")
    if not command.strip():
        raise ToolError("Error: the command is empty")
    if "\x00" in command:
        raise ToolError("Error: the command must not contain a NUL character")
    if ctx.sandbox is None:
        raise ToolError("Error: no sandbox is available in this environment, so terminal commands cannot run")
    if args["is_background"]:
        shell_id, pid, output_path = ctx.sandbox.start_background(command)
        return ToolResult(format_background(shell_id, pid, str(output_path)))
    # Parallel calls of one turn run concurrently, each from the shell's current directory (Sandbox.shell is
    # thread-safe); the one that finishes last sets the directory for the next call.
    result = ctx.sandbox.shell(command, timeout=ctx.command_timeout)
    if result.timed_out:
        return ToolResult(format_timed_out(command, result.output, result.cwd))
    return ToolResult(format_completed(command, result.exit_code, result.output, result.cwd))
