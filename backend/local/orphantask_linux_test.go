package local_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/airlock-mcp/airlock/backend/local"
	"github.com/airlock-mcp/airlock/runtime"
)

// A task whose container is gone (a killed airlock's sandbox whose task was
// created after a sweep removed its container) is ended by the sweep of
// orphaned tasks, rootfs mount and all. The state is made the way it arises:
// the container's record deleted under its task.
func TestOrphanTaskIsRemoved(t *testing.T) {
	s := need(t)
	var sm runtime.SessionManager = s.Manager
	sess, err := sm.OpenSession(context.Background(), runtime.SessionOptions{ID: "sorph" + runtime.NewRunID(), Limits: limits()})
	if err != nil {
		t.Fatal(err)
	}
	id := "airlock-" + sess.ID()
	ctx := namespaces.WithNamespace(context.Background(), s.Config.Containerd.Namespace)
	if err := s.Client.ContainerService().Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		s.Manager.WaitTeardowns()
		_ = s.Client.SnapshotService(local.Snapshotter).Remove(ctx, id)
		assertNoSandboxes(t, s)
	})
	n, err := local.RemoveOrphanTasks(context.Background(), s.Client, s.Config.Containerd.Namespace)
	if err != nil || n < 1 {
		t.Fatalf("RemoveOrphanTasks: %d, %v", n, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		listed := false
		resp, err := s.Client.TaskService().List(ctx, &tasks.ListTasksRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range resp.Tasks {
			listed = listed || tk.ID == id
		}
		mounts, _ := os.ReadFile("/proc/mounts")
		mounted := strings.Contains(string(mounts), "/"+id+"/rootfs")
		if !listed && !mounted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan task is still there after 30 s (listed %v, rootfs mounted %v)", listed, mounted)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
