"""A misbehaving plugin for Sluice's isolation tests: config `behaviour` picks how it fails.
Not an example to follow."""

import wit_world
from wit_world.imports import host
from wit_world.imports.types import Classification, Outcome, Outcome_Keep, Outcome_Set, Request


class WitWorld(wit_world.WitWorld):
    def extract(self, request: Request) -> Outcome:
        behaviour = host.config("behaviour")
        if behaviour == "loop":
            spins = 0
            while True:
                spins += 1
        if behaviour == "grow":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        if behaviour == "trap":
            raise RuntimeError("hostile plugin raises on purpose")
        if behaviour == "bad-scope":
            return Outcome_Set(Classification(scope="not a scope!", limit_key=None))
        return Outcome_Keep()
