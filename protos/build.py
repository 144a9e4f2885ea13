"""`python -m protos.build`: bring protos/gen up to date (importing `protos` already did)."""

from protos._stubs import GEN, ensure

if __name__ == "__main__":
    ensure()
    print(f"stubs up to date in {GEN}")
