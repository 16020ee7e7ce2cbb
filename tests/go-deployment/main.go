// A deployment written with the Restate Go SDK, for Sluice's black-box tests.
//
// Usage: go-deployment <port>  (HTTP/2 with prior knowledge, the SDK's own server)
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"sync"
	"time"

	restate "github.com/restatedev/sdk-go"
	"github.com/restatedev/sdk-go/server"
)

// What the handlers count in this process: how many `GoMeter/hold` run at once and the most
// seen, the side effects `GoMeter/runOnce` made inside `restate.Run` (a replay must not repeat
// them), and the newest awakeable `awaitAwakeable` waits on.
var (
	mu            sync.Mutex
	holding       int
	mostHolding   int
	effects       int
	lastAwakeable string
)

// Who is the scope and limit key an invocation started with.
type Who struct {
	Scope    string `json:"scope"`
	LimitKey string `json:"limitKey"`
}

// Fan asks for `Calls` calls (or `Sends` sends) of `hold(Millis)` in `Scope` under `LimitKey`.
type Fan struct {
	Scope    string `json:"scope"`
	LimitKey string `json:"limitKey"`
	Calls    int    `json:"calls"`
	Sends    int    `json:"sends"`
	Millis   int    `json:"millis"`
}

// Once is what `runOnce` saw: the effect's journaled result and how many effects ran.
type Once struct {
	Seen    int `json:"seen"`
	Effects int `json:"effects"`
}

// hold holds for `millis` (not durably: the slot stays taken), counting how many hold at once.
func hold(ctx restate.Context, millis int) (int, error) {
	mu.Lock()
	holding++
	if holding > mostHolding {
		mostHolding = holding
	}
	mu.Unlock()
	time.Sleep(time.Duration(millis) * time.Millisecond)
	mu.Lock()
	holding--
	mu.Unlock()
	return millis, nil
}

// peak answers the most `hold`s seen at once since the last `peak`, and starts counting again.
func peak(ctx restate.Context, _ restate.Void) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	seen := mostHolding
	mostHolding = 0
	return seen, nil
}

// whoami answers the scope and limit key this invocation started with (protocol V7).
func whoami(ctx restate.Context, _ restate.Void) (Who, error) {
	request := ctx.Request()
	return Who{Scope: request.Scope, LimitKey: request.LimitKey}, nil
}

// fanOut calls `hold(millis)` `calls` times at once through a client scoped to `scope`, each
// under `limitKey`.
func fanOut(ctx restate.Context, fan Fan) (int, error) {
	client := restate.Service[int](ctx, "GoMeter", "hold", restate.WithScope(fan.Scope))
	futures := make([]restate.ResponseFuture[int], 0, fan.Calls)
	for i := 0; i < fan.Calls; i++ {
		futures = append(futures, client.RequestFuture(fan.Millis, restate.WithLimitKey(fan.LimitKey)))
	}
	for _, future := range futures {
		if _, err := future.Response(); err != nil {
			return 0, err
		}
	}
	return fan.Calls, nil
}

// sendHolds sends `hold(millis)` `sends` times through a client scoped to `scope`.
func sendHolds(ctx restate.Context, fan Fan) (int, error) {
	client := restate.ServiceSend(ctx, "GoMeter", "hold", restate.WithScope(fan.Scope))
	for i := 0; i < fan.Sends; i++ {
		client.Send(fan.Millis, restate.WithLimitKey(fan.LimitKey))
	}
	return fan.Sends, nil
}

// askWho asks `whoami` in `scope` under `limitKey`.
func askWho(ctx restate.Context, who Who) (Who, error) {
	return restate.Service[Who](ctx, "GoMeter", "whoami", restate.WithScope(who.Scope)).
		Request(restate.Void{}, restate.WithLimitKey(who.LimitKey))
}

// runOnce makes one side effect in `restate.Run`, then sleeps durably for `millis`: the effect
// is journaled before the sleep, so an attempt that resumes after it (a suspension, or a crash
// of the server) replays it and never repeats it.
func runOnce(ctx restate.Context, millis int) (Once, error) {
	seen, err := restate.Run(ctx, func(restate.RunContext) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		effects++
		return effects, nil
	}, restate.WithName("effect"))
	if err != nil {
		return Once{}, err
	}
	if err := restate.Sleep(ctx, time.Duration(millis)*time.Millisecond); err != nil {
		return Once{}, err
	}
	mu.Lock()
	defer mu.Unlock()
	return Once{Seen: seen, Effects: effects}, nil
}

// spend reports `amount` as what it spent (`restate.Run` steps named `sluice:cost`), in two
// steps around a durable sleep, and answers it.
func spend(ctx restate.Context, amount uint64) (uint64, error) {
	first := amount / 2
	report := func(part uint64) error {
		_, err := restate.Run(ctx, func(restate.RunContext) (uint64, error) {
			return part, nil
		}, restate.WithName("sluice:cost"))
		return err
	}
	if err := report(first); err != nil {
		return 0, err
	}
	if err := restate.Sleep(ctx, 20*time.Millisecond); err != nil {
		return 0, err
	}
	if err := report(amount - first); err != nil {
		return 0, err
	}
	return amount, nil
}

// effectsSoFar answers how many side effects `runOnce` made in this process.
func effectsSoFar(ctx restate.Context, _ restate.Void) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	return effects, nil
}

// awaitAwakeable waits for an awakeable to be resolved, and answers its value.
func awaitAwakeable(ctx restate.Context, _ restate.Void) (string, error) {
	awakeable := restate.Awakeable[string](ctx)
	mu.Lock()
	lastAwakeable = awakeable.Id()
	mu.Unlock()
	return awakeable.Result()
}

// lastAwakeableID answers the newest awakeable `awaitAwakeable` waits on.
func lastAwakeableID(ctx restate.Context, _ restate.Void) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	return lastAwakeable, nil
}

// add adds `by` to the object's count, kept in its state.
func add(ctx restate.ObjectContext, by int) (int, error) {
	count, err := restate.Get[int](ctx, "count")
	if err != nil {
		return 0, err
	}
	count += by
	restate.Set(ctx, "count", count)
	return count, nil
}

// get answers the object's count.
func get(ctx restate.ObjectSharedContext, _ restate.Void) (int, error) {
	return restate.Get[int](ctx, "count")
}

// signupRun waits for `confirm` to resolve the `code` promise, then answers with it.
func signupRun(ctx restate.WorkflowContext, email string) (string, error) {
	code, err := restate.Promise[string](ctx, "code").Result()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s confirmed with %s", email, code), nil
}

// confirm resolves the workflow's `code` promise.
func confirm(ctx restate.WorkflowSharedContext, code string) (string, error) {
	if err := restate.Promise[string](ctx, "code").Resolve(code); err != nil {
		return "", err
	}
	return "ok", nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go-deployment <port>")
		os.Exit(2)
	}
	port, err := strconv.Atoi(os.Args[1])
	if err != nil || port <= 0 || port > 65535 {
		fmt.Fprintln(os.Stderr, "usage: go-deployment <port>")
		os.Exit(2)
	}
	meter := restate.NewService("GoMeter").
		Handler("hold", restate.NewServiceHandler(hold)).
		Handler("peak", restate.NewServiceHandler(peak)).
		Handler("whoami", restate.NewServiceHandler(whoami)).
		Handler("fanOut", restate.NewServiceHandler(fanOut)).
		Handler("sendHolds", restate.NewServiceHandler(sendHolds)).
		Handler("askWho", restate.NewServiceHandler(askWho)).
		Handler("runOnce", restate.NewServiceHandler(runOnce)).
		Handler("spend", restate.NewServiceHandler(spend)).
		Handler("effects", restate.NewServiceHandler(effectsSoFar)).
		Handler("awaitAwakeable", restate.NewServiceHandler(awaitAwakeable)).
		Handler("lastAwakeable", restate.NewServiceHandler(lastAwakeableID))
	counter := restate.NewObject("GoCounter").
		Handler("add", restate.NewObjectHandler(add)).
		Handler("get", restate.NewObjectSharedHandler(get))
	signup := restate.NewWorkflow("GoSignup").
		Handler("run", restate.NewWorkflowHandler(signupRun)).
		Handler("confirm", restate.NewWorkflowSharedHandler(confirm))
	address := fmt.Sprintf("127.0.0.1:%d", port)
	err = server.NewRestate().Bind(meter).Bind(counter).Bind(signup).Start(context.Background(), address)
	if err != nil {
		log.Fatal(err)
	}
}
