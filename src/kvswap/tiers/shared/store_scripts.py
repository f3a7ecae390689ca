"""The Lua scripts of the shared page store: each mutation of a mind's shared state is one
script, so Redis checks the lease and fence (`lease.OWNS_LUA`) and applies the change at once.

KEYS are always the mind's own keys (one hash tag: one Redis Cluster slot). Replies are arrays
whose first element is the outcome: 1 done, 0 not the owner, negative for the refusals below.
"""

from __future__ import annotations

from typing import Final

from kvswap.tiers.shared.lease import OWNS_LUA

NOT_OWNER: Final = 0
DONE: Final = 1
BASE_MOVED: Final = -1  # the manifest is not the generation the publish was planned against
CHUNK_LOST: Final = -2  # a chunk of the new generation expired before the commit
DUPLICATE: Final = 2  # token append: this turn id was applied already
GAP: Final = 3  # token append: the log holds fewer tokens than the append's base

# KEYS lease, fence, gens, manifest; ARGV holder, fence
# -> {1, new gen, manifest gen, manifest body or nil} | {0}
BEGIN: Final = (
    OWNS_LUA
    + """
if not owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {0} end
local gen = redis.call('INCR', KEYS[3])
local cur = tonumber(redis.call('HGET', KEYS[4], 'gen') or '0')
return {1, gen, cur, redis.call('HGET', KEYS[4], 'body')}
"""
)

# KEYS lease, fence, manifest, then n_new chunk keys of the new generation, then n_reused chunk
# keys of older generations the new one references, then chunk keys to unlink; ARGV holder,
# fence, gen, base gen, body, n_new, n_reused -> {1} | {0} | {-1, gen} | {-2, i}
# Idempotent: a COMMIT that runs again after its reply was lost (redis-py re-sends a script
# whose connection broke) finds its own generation committed and answers done, changing
# nothing; generations are unique (INCR gens), so no other publish can have committed `gen`.
# Every chunk the new manifest references, reused ones included, must exist: a reused chunk
# that is gone answers CHUNK_LOST, and the publish is planned again as a whole page.
COMMIT: Final = (
    OWNS_LUA
    + """
local cur = tonumber(redis.call('HGET', KEYS[3], 'gen') or '0')
local gen = tonumber(ARGV[3])
if cur == gen and redis.call('HGET', KEYS[3], 'fence') == ARGV[2] then return {1} end
if not owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {0} end
if cur ~= tonumber(ARGV[4]) or gen <= cur then return {-1, cur} end
local last_new = 3 + tonumber(ARGV[6])
local last_ref = last_new + tonumber(ARGV[7])
for i = 4, last_ref do
  if redis.call('EXISTS', KEYS[i]) == 0 then return {-2, i - 4} end
end
for i = 4, last_new do redis.call('PERSIST', KEYS[i]) end
redis.call('HSET', KEYS[3], 'gen', gen, 'fence', ARGV[2], 'body', ARGV[5])
for i = last_ref + 1, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {1}
"""
)

# KEYS manifest, then the chunk keys of a generation whose commit was refused; ARGV its gen
# -> {1} unlinked | {0} kept: the manifest is that very generation (its commit did land)
UNLINK_REFUSED: Final = """
if tonumber(redis.call('HGET', KEYS[1], 'gen') or '0') == tonumber(ARGV[1]) then return {0} end
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {1}
"""

# KEYS manifest, then the chunk keys it references; ARGV expected gen, new gen, body
# -> {1} | {-1, gen}   (budget eviction: no lease, the manifest's generation is the guard)
DEGRADE: Final = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
if cur ~= tonumber(ARGV[1]) or tonumber(ARGV[2]) <= cur then return {-1, cur} end
redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'body', ARGV[3])
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {1}
"""

# KEYS lease, fence, tokens, turns, chat; ARGV holder, fence, turn id, n_base, int32 LE bytes,
# the turn's chat record ("": none, the key goes)
# -> {1, n} appended | {2, n} duplicate turn | {3, n} gap | {0}
APPEND_TOKENS: Final = (
    OWNS_LUA
    + """
if not owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {0} end
local len = redis.call('STRLEN', KEYS[3])
if redis.call('LPOS', KEYS[4], ARGV[3]) then return {2, len / 4} end
local base = tonumber(ARGV[4]) * 4
if len < base then return {3, len / 4} end
if len > base then
  if base == 0 then
    redis.call('DEL', KEYS[3])
  else
    redis.call('SET', KEYS[3], redis.call('GETRANGE', KEYS[3], 0, base - 1))
  end
end
local n = redis.call('APPEND', KEYS[3], ARGV[5])
redis.call('LPUSH', KEYS[4], ARGV[3])
redis.call('LTRIM', KEYS[4], 0, 63)
if ARGV[6] == '' then redis.call('DEL', KEYS[5]) else redis.call('SET', KEYS[5], ARGV[6]) end
return {1, n / 4}
"""
)

# KEYS lease, fence, manifest, tokens, turns, chat, then every chunk key; ARGV holder, fence
# -> {1} | {0}   (the mind leaves the tier; the lease stays with its holder until released)
DROP: Final = (
    OWNS_LUA
    + """
if not owns(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {0} end
for i = 3, #KEYS do redis.call('UNLINK', KEYS[i]) end
return {1}
"""
)

# KEYS lease, manifest, tokens, turns, chat; ARGV the manifest's generation
# -> {1} | {0} held | {-1}
# (budget eviction of a tokens-only mind nobody holds: its manifest, token log, turn ids and
# chat record go; its fence and generation counter stay, so a later owner's fence only grows)
EVICT: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
if tonumber(redis.call('HGET', KEYS[2], 'gen') or '0') ~= tonumber(ARGV[1]) then return {-1} end
redis.call('UNLINK', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return {1}
"""
