"""Drive runcell's agent-sandbox contract with the real Python SDK (k8s-agent-sandbox).

The SDK's own objects do the talking: a `Sandbox` with a direct connection
(`SandboxDirectConnectionConfig(api_url=SANDBOX_URL)`), whose `commands` and `files` send
the SDK's requests. There is no Kubernetes API here: the SDK asks its helper for the Sandbox
object only to learn a pod IP or name, and this helper answers that there is none (the
direct connection needs neither). What the SDK saw is printed as one JSON object; the
assertions are in crates/runcell/tests/agent_sandbox.rs.
"""

import importlib.metadata
import io
import json
import os
import sys

from k8s_agent_sandbox.exceptions import SandboxRequestError
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.sandbox import Sandbox


class NoCluster:
    """Stands in for the SDK's K8sHelper: no Sandbox object is known."""

    def get_sandbox(self, name, namespace):
        return None

    def __getattr__(self, name):
        raise RuntimeError(f"the SDK asked the Kubernetes API for {name}: not available here")


def main():
    url = os.environ["SANDBOX_URL"]
    sb = Sandbox(
        claim_name="runcell-claim",
        sandbox_id="runcell-sandbox",
        namespace="default",
        connection_config=SandboxDirectConnectionConfig(api_url=url),
        k8s_helper=NoCluster(),
    )
    report = {"sdk_version": importlib.metadata.version("k8s-agent-sandbox")}

    r = sb.commands.run("echo 'hello world'")
    report["hello"] = {"stdout": r.stdout, "exit_code": r.exit_code, "timed_out": r.timed_out}
    report["exit_code"] = sb.commands.run("exit 7").exit_code
    r = sb.commands.run("sleep 30", command_timeout=0.5)
    report["timeout"] = {"exit_code": r.exit_code, "timed_out": r.timed_out}

    sb.files.write("data/in.csv", "a,b\n1,2\n")
    report["read"] = sb.files.read("data/in.csv").decode()
    # A stream: the SDK sends it as a chunked multipart body.
    blob = bytes(range(256)) * 1172 + b"tail"
    sb.files.write("big.bin", io.BytesIO(blob[:300_000]))
    sink = io.BytesIO()
    report["streamed_read_bytes"] = sb.files.read_to("big.bin", sink)
    report["streamed_write_matches"] = sink.getvalue() == blob[:300_000]
    report["exists"] = [sb.files.exists("data/in.csv"), sb.files.exists("nope.txt")]
    report["listed"] = sorted([e.name, e.type] for e in sb.files.list("."))
    report["listed_in_data"] = [[e.name, e.type, e.size] for e in sb.files.list("data")]
    report["cat_from_command"] = sb.commands.run("cat /app/data/in.csv").stdout

    try:
        sb.files.read("../etc/passwd")
        report["unsafe_refused_by_sdk"] = False
    except ValueError:
        report["unsafe_refused_by_sdk"] = True
    try:
        sb.files.read("../etc/passwd", allow_unsafe_paths=True)
        report["unsafe_refused_by_runcell"] = None
    except SandboxRequestError as e:
        report["unsafe_refused_by_runcell"] = e.status_code
    # The legacy contract has no delete: the SDK says so itself.
    try:
        sb.files.delete("big.bin")
        report["delete"] = "deleted"
    except NotImplementedError:
        report["delete"] = "NotImplementedError"

    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
