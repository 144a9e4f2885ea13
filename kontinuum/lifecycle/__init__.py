"""Day-2 operations (DESIGN §10): upgrade and scaling plans and their steps, no Pulumi."""
