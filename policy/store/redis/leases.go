package redis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/vmgate/vmgate/policy/store"
)

var _ store.Leases = (*Store)(nil)

// Leases: a JSON string per lease (Prefix + "l:" + id), a set of all ids
// (Prefix + "li"), the lease id of each name (Prefix + "lv:" + name) and a hash
// per quota key (Prefix + "q:" + key) mapping the id of every lease that
// holds the quota to the units it holds. AcquireLease is one Lua script
// that sums every quota's hash, checks them all and only then writes, so
// acquisitions from any number of replicas are exact, like ReserveAll.
// ReleaseLease is one script that removes the lease from all of them;
// UpdateLease a compare-and-set of the JSON the caller's revision was read
// from. Nothing expires: a lease lives until it is released.

func (s *Store) leaseKey(id string) string     { return s.prefix + "l:" + id }
func (s *Store) leaseIDsKey() string           { return s.prefix + "li" }
func (s *Store) leaseVMKey(name string) string { return s.prefix + "lv:" + name }
func (s *Store) quotaKey(k string) string      { return s.prefix + "q:" + k }

// acquireLeaseScript: KEYS lease, ids set, name key, then the quota keys;
// ARGV id, JSON, then max and weight per quota. Returns {0} when stored,
// {1} when the id exists, {2, id} when the name has lease id, {3, i, used}
// when quota i has no room.
var acquireLeaseScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return {1} end
local other = redis.call('GET', KEYS[3])
if other then return {2, other} end
for i = 4, #KEYS do
  local used = 0
  for _, w in ipairs(redis.call('HVALS', KEYS[i])) do used = used + tonumber(w) end
  local max = tonumber(ARGV[2*(i-3)+1])
  local weight = tonumber(ARGV[2*(i-3)+2])
  if used + weight > max then return {3, i-3, used} end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[1])
for i = 4, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[1], ARGV[2*(i-3)+2])
end
return {0}
`)

// releaseLeaseScript: KEYS lease, ids set, name key, then the quota keys;
// ARGV id. Returns 1 when released, 0 when the lease was gone.
var releaseLeaseScript = goredis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
for i = 4, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
return 1
`)

// updateLeaseScript: KEYS lease; ARGV the JSON read, the JSON to write.
// Returns 1 when written, 0 when the stored JSON was not the one read.
var updateLeaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1
`)

func (s *Store) leaseKeys(l store.Lease) []string {
	keys := []string{s.leaseKey(l.ID), s.leaseIDsKey(), s.leaseVMKey(l.Name)}
	for _, q := range l.Quotas {
		keys = append(keys, s.quotaKey(q.Key))
	}
	return keys
}

// AcquireLease implements store.Leases with one Lua script.
func (s *Store) AcquireLease(ctx context.Context, l store.Lease) error {
	l, err := store.ValidateLease(l)
	if err != nil {
		return fmt.Errorf("redis: acquire lease: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("acquire lease", err)
	}
	v, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("redis: acquire lease: %w", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	args := []any{l.ID, v}
	for _, q := range l.Quotas {
		args = append(args, q.Max, q.Weight)
	}
	cmd, ack := s.script(ctx, acquireLeaseScript, s.leaseKeys(l), args...)
	res, err := cmd.Slice()
	if err != nil {
		return unavailable("acquire lease", err)
	}
	code, _ := res[0].(int64)
	switch {
	case code == 0 && len(res) == 1 && ack != nil:
		return unavailable("acquire lease", ack)
	case code == 0 && len(res) == 1:
		return nil
	case code == 1 && len(res) == 1:
		return fmt.Errorf("redis: acquire lease: %w: lease %q", store.ErrDuplicate, l.ID)
	case code == 2 && len(res) == 2:
		return fmt.Errorf("redis: acquire lease: %w: VM %q already has lease %q", store.ErrDuplicate, l.Name, res[1])
	case code == 3 && len(res) == 3:
		i, _ := res[1].(int64)
		used, _ := res[2].(int64)
		if i >= 1 && int(i) <= len(l.Quotas) {
			q := l.Quotas[i-1]
			return &store.QuotaError{Quota: q, Used: used, Holders: s.holders(ctx, q.Key)}
		}
	}
	return unavailable("acquire lease", fmt.Errorf("unexpected script reply %v", res))
}

// holders reads the leases holding quota key, for a refusal's message
// (best effort: nil when Redis does not answer).
func (s *Store) holders(ctx context.Context, key string) []store.Lease {
	ids, err := s.client.HKeys(ctx, s.quotaKey(key)).Result()
	if err != nil || len(ids) == 0 {
		return nil
	}
	out, _, err := s.leases(ctx, ids)
	if err != nil {
		return nil
	}
	return out
}

// leases reads the leases ids (skipping those gone) with their JSON.
func (s *Store) leases(ctx context.Context, ids []string) ([]store.Lease, []string, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.leaseKey(id)
	}
	vals, err := s.client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, nil, err
	}
	out := make([]store.Lease, 0, len(vals))
	raws := make([]string, 0, len(vals))
	for i, v := range vals {
		raw, ok := v.(string)
		if !ok {
			continue // released since the ids were read
		}
		var l store.Lease
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			return nil, nil, fmt.Errorf("lease %q: decode: %w", ids[i], err)
		}
		out = append(out, l)
		raws = append(raws, raw)
	}
	return out, raws, nil
}

// getLease reads lease id and the JSON it was read from.
func (s *Store) getLease(ctx context.Context, id string) (store.Lease, string, error) {
	raw, err := s.client.Get(ctx, s.leaseKey(id)).Result()
	if errors.Is(err, goredis.Nil) {
		return store.Lease{}, "", fmt.Errorf("lease %q: %w", id, store.ErrUnknownLease)
	}
	if err != nil {
		return store.Lease{}, "", fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	var l store.Lease
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		return store.Lease{}, "", fmt.Errorf("%w: lease %q: decode: %w", store.ErrUnavailable, id, err)
	}
	return l, raw, nil
}

// GetLease implements store.Leases.
func (s *Store) GetLease(ctx context.Context, id string) (store.Lease, error) {
	if err := store.ValidateLeaseID(id); err != nil {
		return store.Lease{}, fmt.Errorf("redis: get lease: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, unavailable("get lease", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	l, _, err := s.getLease(ctx, id)
	if err != nil {
		return store.Lease{}, fmt.Errorf("redis: get lease: %w", err)
	}
	return l, nil
}

// ListLeases implements store.Leases.
func (s *Store) ListLeases(ctx context.Context) ([]store.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, unavailable("list leases", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	ids, err := s.client.SMembers(ctx, s.leaseIDsKey()).Result()
	if err != nil {
		return nil, unavailable("list leases", err)
	}
	if len(ids) == 0 {
		return []store.Lease{}, nil
	}
	out, _, err := s.leases(ctx, ids)
	if err != nil {
		return nil, unavailable("list leases", err)
	}
	store.SortLeases(out)
	return out, nil
}

// UpdateLease implements store.Leases: read, check, compare-and-set.
func (s *Store) UpdateLease(ctx context.Context, l store.Lease) (store.Lease, error) {
	if err := store.ValidateLeaseID(l.ID); err != nil {
		return store.Lease{}, fmt.Errorf("redis: update lease: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return store.Lease{}, unavailable("update lease", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	old, raw, err := s.getLease(ctx, l.ID)
	if err != nil {
		return store.Lease{}, fmt.Errorf("redis: update lease: %w", err)
	}
	next, err := store.CheckLeaseUpdate(old, l)
	if err != nil {
		return store.Lease{}, fmt.Errorf("redis: update lease: %w", err)
	}
	v, err := json.Marshal(next)
	if err != nil {
		return store.Lease{}, fmt.Errorf("redis: update lease: %w", err)
	}
	cmd, ack := s.script(ctx, updateLeaseScript, []string{s.leaseKey(l.ID)}, raw, v)
	ok, err := cmd.Int64()
	if err != nil {
		return store.Lease{}, unavailable("update lease", err)
	}
	if ok == 1 && ack != nil {
		return store.Lease{}, unavailable("update lease", ack)
	}
	if ok == 0 {
		// Changed or released between the read and the script.
		if _, _, err := s.getLease(ctx, l.ID); err != nil {
			return store.Lease{}, fmt.Errorf("redis: update lease: %w", err)
		}
		return store.Lease{}, fmt.Errorf("redis: update lease: %w: lease %q", store.ErrStaleLease, l.ID)
	}
	return next, nil
}

// ReleaseLease implements store.Leases: the lease's name and quota keys
// are read from it, then one script removes it from all of them.
func (s *Store) ReleaseLease(ctx context.Context, id string) error {
	if err := store.ValidateLeaseID(id); err != nil {
		return fmt.Errorf("redis: release lease: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return unavailable("release lease", err)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	l, _, err := s.getLease(ctx, id)
	if err != nil {
		return fmt.Errorf("redis: release lease: %w", err)
	}
	cmd, ack := s.script(ctx, releaseLeaseScript, s.leaseKeys(l), id)
	done, err := cmd.Int64()
	if err != nil {
		return unavailable("release lease", err)
	}
	if done == 1 && ack != nil {
		return unavailable("release lease", ack)
	}
	if done == 0 {
		return fmt.Errorf("redis: release lease: lease %q: %w", id, store.ErrUnknownLease)
	}
	return nil
}
