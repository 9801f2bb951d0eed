// A Go client of Lethe built from stubs that buf generates from proto/
// (buf.gen.yaml): it proves that the Go options of the proto files work and
// that the API is usable from another language. scripts/check_go_client.sh
// builds it and runs it against a real `lethe serve`.
//
// Usage: lethe-go-client HOST:PORT TOKEN OWNER
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	errorsv1 "lethe/gen/go/lethe/errors/v1"
	lethev1 "lethe/gen/go/lethe/v1"
)

var failed int
var passed int

func check(ok bool, what string, args ...interface{}) {
	if ok {
		passed++
		fmt.Printf("ok   %s\n", fmt.Sprintf(what, args...))
		return
	}
	failed++
	fmt.Printf("FAIL %s\n", fmt.Sprintf(what, args...))
}

func must(err error, what string) {
	if err != nil {
		fmt.Printf("FAIL %s: %v\n", what, err)
		os.Exit(1)
	}
}

// reason is the ErrorInfo reason of domain "lethe" carried by err, or "".
func reason(err error) string {
	for _, detail := range status.Convert(err).Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok && info.Domain == "lethe" {
			return info.Reason
		}
	}
	return ""
}

func main() {
	if len(os.Args) != 4 {
		fmt.Println("usage: lethe-go-client HOST:PORT TOKEN OWNER")
		os.Exit(2)
	}
	target, token, owner := os.Args[1], os.Args[2], os.Args[3]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, target, grpc.WithInsecure(), grpc.WithBlock())
	must(err, "dial "+target)
	defer conn.Close()

	health, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	must(err, "Health.Check")
	check(health.Status == healthpb.HealthCheckResponse_SERVING, "health is SERVING")

	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	threads := lethev1.NewThreadsClient(conn)
	parent := "owners/" + owner

	_, err = threads.CreateThread(ctx, &lethev1.CreateThreadRequest{Parent: parent})
	check(status.Code(err) == codes.Unauthenticated &&
		reason(err) == errorsv1.ErrorReason_MISSING_TOKEN.String(),
		"a call without a token is UNAUTHENTICATED / MISSING_TOKEN (got %v / %q)", status.Code(err), reason(err))

	thread, err := threads.CreateThread(authed, &lethev1.CreateThreadRequest{Parent: parent, ThreadId: "go", Title: "from Go"})
	must(err, "CreateThread")
	check(thread.Name == parent+"/threads/go" && thread.Kind == lethev1.Thread_CONVERSATION,
		"CreateThread returns %s, a CONVERSATION", thread.Name)

	texts := []string{"I adopted a puppy named Biscuit", "We walk by the river", "Biscuit likes carrots"}
	var inputs []*lethev1.TurnInput
	for _, text := range texts {
		inputs = append(inputs, &lethev1.TurnInput{Role: lethev1.Role_USER, Text: text, Commit: true})
	}
	appended, err := threads.AppendTurns(authed, &lethev1.AppendTurnsRequest{Parent: thread.Name, Turns: inputs})
	must(err, "AppendTurns")
	check(len(appended.Turns) == 3 && appended.Turns[2].Seq == 3 && appended.Turns[0].State == lethev1.State_COMMITTED,
		"AppendTurns stores 3 committed turns, seq 1..3")

	var listed []string
	pageToken := ""
	pages := 0
	for {
		page, err := threads.ListTurns(authed, &lethev1.ListTurnsRequest{Parent: thread.Name, PageSize: 2, PageToken: pageToken})
		must(err, "ListTurns")
		pages++
		for _, turn := range page.Turns {
			listed = append(listed, turn.Text)
		}
		if page.NextPageToken == "" {
			break
		}
		pageToken = page.NextPageToken
	}
	check(pages == 2 && len(listed) == 3 && listed[2] == texts[2], "ListTurns pages of 2 give the 3 turns in order (%d pages)", pages)

	_, err = threads.ListTurns(authed, &lethev1.ListTurnsRequest{Parent: thread.Name, PageToken: "bm90LWEtdG9rZW4"})
	check(status.Code(err) == codes.InvalidArgument && reason(err) == errorsv1.ErrorReason_BAD_FIELD.String(),
		"a page token the server did not issue is INVALID_ARGUMENT / BAD_FIELD")

	hits, err := lethev1.NewRetrievalClient(conn).Search(authed, &lethev1.SearchRequest{
		Parent: parent, QueryText: "carrots", Mode: lethev1.SearchRequest_LEXICAL})
	must(err, "Search")
	check(len(hits.Hits) >= 1 && hits.Hits[0].GetTurn().GetText() == texts[2],
		"Search LEXICAL 'carrots' finds %q first", texts[2])

	receipt, err := lethev1.NewLifecycleClient(conn).Forget(authed, &lethev1.ForgetRequest{Names: []string{appended.Turns[0].Name}})
	must(err, "Forget")
	check(receipt.Deleted == 1 && len(receipt.Destinations) > 0, "Forget returns a receipt (%d deleted)", receipt.Deleted)

	_, err = threads.GetTurn(authed, &lethev1.GetTurnRequest{Name: appended.Turns[0].Name})
	check(status.Code(err) == codes.NotFound && reason(err) == errorsv1.ErrorReason_RECORD_DELETED.String(),
		"GetTurn of the forgotten turn is NOT_FOUND / RECORD_DELETED (got %v / %q)", status.Code(err), reason(err))
	_, err = threads.GetTurn(authed, &lethev1.GetTurnRequest{Name: thread.Name + "/turns/99"})
	check(status.Code(err) == codes.NotFound && reason(err) == errorsv1.ErrorReason_NOT_FOUND.String(),
		"GetTurn of a turn that never existed is NOT_FOUND / NOT_FOUND")

	fmt.Printf("go client: %d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}
