"""What every dynamic provider here shares: pure diffs and secret-output options.

Providers stay stateless and credential-free (DESIGN §3): Pulumi pickles the provider object
into the state, so credentials travel only as secret inputs and come back as secret outputs.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import DiffResult


def diff_inputs(olds: dict, news: dict, *, replace_on=(), update_on=()) -> DiffResult:
    """Pure diff over named inputs; replacements delete first (identities never coexist)."""
    changed = [k for k in (*replace_on, *update_on) if olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(changed), replaces=[k for k in changed if k in replace_on],
                      delete_before_replace=True)


def with_secret_outputs(opts: pulumi.ResourceOptions | None, *names: str) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=list(names)))
