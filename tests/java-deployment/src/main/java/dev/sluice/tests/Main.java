package dev.sluice.tests;

import dev.restate.sdk.HandlerRunner;
import dev.restate.sdk.endpoint.Endpoint;
import dev.restate.sdk.http.vertx.HttpEndpointRequestHandler;
import io.vertx.core.Vertx;
import io.vertx.core.http.HttpServerOptions;
import java.util.concurrent.Executors;

/** Usage: Main <port>. Serves the three services over HTTP/2 (prior knowledge) on loopback. */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: Main <port>");
      System.exit(2);
    }
    int port = Integer.parseInt(args[0]);
    // A thread per running handler: `JavaMeter/hold` blocks its thread while it holds, and the
    // tests count how many hold at once.
    Endpoint endpoint =
        Endpoint.bind(new JavaMeter(), HandlerRunner.Options.withExecutor(Executors.newCachedThreadPool()))
            .bind(new JavaCounter())
            .bind(new JavaSignup())
            .build();
    try {
      Vertx.vertx()
          .createHttpServer(new HttpServerOptions().setHost("127.0.0.1").setPort(port))
          .requestHandler(HttpEndpointRequestHandler.fromEndpoint(endpoint))
          .listen()
          .toCompletionStage()
          .toCompletableFuture()
          .get();
    } catch (Exception e) {
      // Vert.x's threads would keep the JVM alive without a listener; exiting lets the tests
      // start it again on another port when this one was taken.
      System.err.println("cannot listen on 127.0.0.1:" + port + ": " + e);
      System.exit(1);
    }
  }
}
