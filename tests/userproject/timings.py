"""The timings the user's project tier sets in its projects."""

#: The lease the tier's projects set: short enough that recoveries happen within a test.
LEASE_SECONDS = 3
