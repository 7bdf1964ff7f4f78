"""umemc for ComfyUI: a custom node package (copy or link this folder into ComfyUI/custom_nodes/umemc) that
asks umemc's gateway for a lease sized from each workflow's models before the prompt runs, and releases it
after. See README.md here."""

from __future__ import annotations

from .hook import LeaseHook, UmemcRefused

NODE_CLASS_MAPPINGS = {"UmemcRefused": UmemcRefused}
NODE_DISPLAY_NAME_MAPPINGS = {"UmemcRefused": "umemc: refused"}
WEB_DIRECTORY = None


def _install() -> None:
    """Inside ComfyUI: register the prompt handler and wrap the executor (ComfyUI's modules exist only there)."""
    try:
        import execution
        import folder_paths
        from server import PromptServer
    except ImportError:
        return  # imported outside ComfyUI (tests, tools): nothing to hook
    from .client import LeaseClient

    hook = LeaseHook(LeaseClient.from_env(), folder_paths.get_full_path)
    PromptServer.instance.add_on_prompt_handler(hook.on_prompt)
    hook.wrap_executor(execution.PromptExecutor)


_install()
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "LeaseHook"]
