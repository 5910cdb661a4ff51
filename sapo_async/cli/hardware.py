"""``sapo-async hardware``: print the generation backend, device and model this machine gets.

The same decision ``just node`` makes at start-up (:func:`sapo_async.ops.hardware.select_backend`),
shown on its own so a volunteer can check a machine before joining a swarm.
"""

from __future__ import annotations

import json

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``hardware`` command to ``app``."""

    @app.command("hardware")
    def hardware_command(
        backend: str = typer.Option("auto", help="auto | vllm | transformers"),
        model: str | None = typer.Option(None, help="override the default model"),
        device: str | None = typer.Option(None, help="cpu | cuda (transformers only)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Show which generation backend, device and model this machine would use, and why."""
        from sapo_async.errors import ConfigError
        from sapo_async.ops.hardware import select_backend

        try:
            choice = select_backend(backend, model=model, device=device)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if as_json:
            typer.echo(
                json.dumps(
                    {
                        "backend": choice.backend,
                        "device": choice.device,
                        "model": choice.model,
                        "gpu_memory_utilization": choice.gpu_memory_utilization,
                        "vllm_version": choice.vllm_version,
                        "reason": choice.reason,
                    }
                )
            )
            return
        typer.echo(f"backend: {choice.backend} on {choice.device}, model: {choice.model}")
        typer.echo(choice.reason)
