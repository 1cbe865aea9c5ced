"""A simulated Chatwoot (the API subset the router uses, its side effects, signed agent-bot webhooks, fault
injection) and a simulated System One, in one aiohttp server. The control API is documented in control.py.

    async with run_sandbox(scenario=doc, webhook_url=router_url, retry_delay_s=0.05) as sandbox:
        conversation = sandbox.create_conversation(1, 7, contact_name="Ada")
        sandbox.customer_message(1, conversation.id, "Hello, I was charged twice")
        await sandbox.settle()
        sandbox.snapshot()["webhooks"]
"""

from sandbox.core import Sandbox
from sandbox.faults import Fault
from sandbox.server import build_app, run_sandbox
from sandbox.webhooks import sign

__all__ = ["Fault", "Sandbox", "build_app", "run_sandbox", "sign"]
