package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// listenUnix listens on a Unix socket at path, mode 0660, owned by root and
// group (so members of group may connect; nobody else can). A socket left by
// a dead daemon is replaced; one a live daemon serves is not.
func listenUnix(path, group string, log *slog.Logger) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another airlock serves this socket already")
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	// Created 0600 and opened up only once its group is right: there is no
	// moment in which a stranger could connect.
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	gid, err := lookupGroup(group)
	if err != nil {
		log.Warn("socket group missing: only root can use the socket", "group", group, "err", err, "fix", "groupadd --system "+group)
		return ln, nil
	}
	if err := os.Chown(path, 0, gid); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chown socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return ln, nil
}

func lookupGroup(name string) (int, error) {
	if name == "" {
		return 0, errors.New("no group configured")
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

type peerKey struct{}

// peerCred is who is on the other end of a Unix connection, as the kernel
// says (SO_PEERCRED): it cannot be forged by the peer.
type peerCred struct {
	PID, UID, GID int
}

// peerContext records the peer's credentials for every request on c.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || serr != nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, peerCred{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid)})
}

// requirePeer admits root and members of group, names them by uid, and
// refuses everyone else: the socket's mode already keeps strangers out, and
// this holds even if someone loosens it.
func requirePeer(group string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, ok := r.Context().Value(peerKey{}).(peerCred)
		if !ok {
			http.Error(w, "Forbidden: unknown peer", http.StatusForbidden)
			return
		}
		name := strconv.Itoa(cred.UID)
		if u, err := user.LookupId(name); err == nil {
			name = u.Username
		}
		if cred.UID != 0 && !inGroup(cred, group) {
			http.Error(w, fmt.Sprintf("Forbidden: user %s is not in group %s (server.socket_group)", name, group), http.StatusForbidden)
			return
		}
		p := Principal{ID: fmt.Sprintf("uid:%d(%s)", cred.UID, name), Transport: "unix"}
		next.ServeHTTP(w, r.WithContext(withPrincipal(r.Context(), p)))
	})
}

// inGroup reports whether the peer's primary or supplementary groups
// include group.
func inGroup(cred peerCred, group string) bool {
	gid, err := lookupGroup(group)
	if err != nil {
		return false
	}
	if cred.GID == gid {
		return true
	}
	u, err := user.LookupId(strconv.Itoa(cred.UID))
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	return err == nil && slices.Contains(ids, strconv.Itoa(gid))
}
