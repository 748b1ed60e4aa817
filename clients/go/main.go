// The Go client's flow against a running memsvc (make test-clients, via run.sh): append two
// turns, wait until they are searchable, search, then a bad request whose field violation
// is read from the status details. Stubs are generated from proto/ by run.sh (protoc with
// Debian's protoc-gen-go and protoc-gen-go-grpc); see README "Calling from other languages".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	memsvcv1 "github.com/memsvc/memsvc/gen/go/memsvc/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	target := flag.String("target", "127.0.0.1:50051", "memsvc HOST:PORT")
	flag.Parse()
	conn, err := grpc.Dial(*target, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithTimeout(30*time.Second))
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	client := memsvcv1.NewMemoryServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()

	events := []*memsvcv1.MemoryEvent{
		{ConversationId: "go-1", TurnId: 0, Speaker: "user",
			Text: "I just adopted a puppy named Biscuit.", Timestamp: "2026-02-02T10:00:00+08:00"},
		{ConversationId: "go-1", TurnId: 1, Speaker: "assistant",
			Text: "Congratulations! What breed is Biscuit?", Timestamp: "2026-02-02T10:01:00+08:00"},
	}
	appended, err := client.AppendEvents(ctx, &memsvcv1.AppendEventsRequest{Events: events})
	if err != nil || appended.Accepted != 2 {
		fail("append: %v %v", appended, err)
	}
	waited, err := client.WaitForIndexed(ctx, &memsvcv1.WaitForIndexedRequest{
		ConversationId: "go-1", TurnId: 1, TimeoutMs: 120000})
	if err != nil || !waited.Indexed {
		fail("wait: %v %v", waited, err)
	}
	found, err := client.EmbedDb(ctx, &memsvcv1.EmbedDbRequest{
		QueryText: "what is the dog called?",
		Filters:   &memsvcv1.SearchFilters{ConversationIds: []string{"go-1"}}})
	if err != nil || len(found.Hits) == 0 || !strings.Contains(found.Hits[0].Text, "Biscuit") {
		fail("search: %v %v", found, err)
	}

	_, err = client.EmbedDb(ctx, &memsvcv1.EmbedDbRequest{QueryText: "x", TopK: 1000})
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument {
		fail("bad request: got %v", err)
	}
	field := ""
	for _, detail := range st.Details() {
		if bad, ok := detail.(*errdetails.BadRequest); ok && len(bad.FieldViolations) > 0 {
			field = bad.FieldViolations[0].Field
		}
	}
	if field != "top_k" {
		fail("field violation: got %q in %v", field, st.Details())
	}
	fmt.Println("go client: append, wait, search, field violation: ok")
}
