"""A RegionGuard from stack config (zones, allowEmpty): the e2e test empties the zones."""

import pulumi

from providers.region_guard import RegionGuard

config = pulumi.Config()
RegionGuard("eu-region", region="eu", zones=config.get_object("zones") or [],
            allow_empty=config.get_bool("allowEmpty") or False)
