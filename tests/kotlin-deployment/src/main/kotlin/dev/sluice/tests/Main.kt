// A Kotlin deployment for Sluice's black-box tests: `KotlinMeter` holds calls (counting how many
// hold at once), fans out scoped sends through the project's `Scoped` helper, and tells the
// scope it runs in. Usage: MainKt <port>; serves HTTP/2 (prior knowledge) on loopback.
package dev.sluice.tests

import dev.restate.common.Request
import dev.restate.common.Target
import dev.restate.sdk.endpoint.Endpoint
import dev.restate.sdk.endpoint.definition.HandlerDefinition
import dev.restate.sdk.endpoint.definition.HandlerType
import dev.restate.sdk.endpoint.definition.ServiceDefinition
import dev.restate.sdk.endpoint.definition.ServiceType
import dev.restate.sdk.http.vertx.HttpEndpointRequestHandler
import dev.restate.sdk.kotlin.Context
import dev.restate.sdk.kotlin.HandlerRunner
import dev.restate.sdk.kotlin.KtSerdes
import dev.restate.serde.kotlinx.KotlinSerializationSerdeFactory
import dev.sluice.scope.Scoped
import io.vertx.core.Vertx
import io.vertx.core.http.HttpServerOptions
import java.util.concurrent.atomic.AtomicInteger
import kotlin.system.exitProcess
import kotlinx.coroutines.delay

/** Calls holding now, and the most that held at once since the last `peak`. */
private val holding = AtomicInteger()
private val peak = AtomicInteger()

private const val SERVICE = "KotlinMeter"

/** A request to `KotlinMeter/<handler>` with `input`. */
private fun meter(handler: String, input: Int) =
    Request.of(Target.service(SERVICE, handler), KtSerdes.json<Int>(), KtSerdes.json<Int>(), input)

/** A handler of `KotlinMeter` taking and answering JSON. */
private inline fun <reified I, reified O> handler(
    name: String,
    noinline body: suspend (Context, I) -> O,
): HandlerDefinition<I, O> =
    HandlerDefinition.of(
        name,
        HandlerType.SHARED,
        KtSerdes.json<I>(),
        KtSerdes.json<O>(),
        HandlerRunner.of(KotlinSerializationSerdeFactory(), HandlerRunner.Options.DEFAULT, body),
    )

private val meterService =
    ServiceDefinition.of(
        SERVICE,
        ServiceType.SERVICE,
        listOf(
            // Holds for `millis`, counted in the peak.
            handler<Int, Int>("hold") { _, millis ->
                val now = holding.incrementAndGet()
                peak.accumulateAndGet(now) { a, b -> maxOf(a, b) }
                try {
                    delay(millis.toLong())
                } finally {
                    holding.decrementAndGet()
                }
                millis
            },
            // The most that held at once since the last call, then starts counting again.
            handler<Int, Int>("peak") { _, _ -> peak.getAndSet(holding.get()) },
            // Sends `count` `hold(300)` into scope `kt`, alternating limit keys `k0` and `k1`.
            handler<Int, Int>("fanOut") { ctx, count ->
                for (i in 0 until count) {
                    ctx.send(Scoped.scope(meter("hold", 300), "kt", "k${i % 2}"))
                }
                count
            },
            // The scope and limit key this call runs under (`scope/key`, `-` for none).
            handler<Int, String>("whoAmI") { ctx, _ ->
                val request = ctx.request()
                Scoped.scopeOf(request).orElse("-") + "/" + Scoped.limitKeyOf(request).orElse("-")
            },
            // Calls `whoAmI` naming no scope: the child inherits this call's scope and key.
            handler<Int, String>("childWhoAmI") { ctx, _ ->
                ctx.call(
                        Request.of(
                            Target.service(SERVICE, "whoAmI"),
                            KtSerdes.json<Int>(),
                            KtSerdes.json<String>(),
                            0,
                        )
                    )
                    .await()
            },
        ),
    )

fun main(args: Array<String>) {
    val port = args.singleOrNull()?.toIntOrNull()
    if (port == null) {
        System.err.println("usage: MainKt <port>")
        exitProcess(2)
    }
    val endpoint = Endpoint.builder().bind(meterService).build()
    try {
        Vertx.vertx()
            .createHttpServer(HttpServerOptions().setHost("127.0.0.1").setPort(port))
            .requestHandler(HttpEndpointRequestHandler.fromEndpoint(endpoint))
            .listen()
            .toCompletionStage()
            .toCompletableFuture()
            .get()
    } catch (e: Exception) {
        // Vert.x's threads would keep the JVM alive without a listener.
        System.err.println("cannot listen on 127.0.0.1:$port: $e")
        exitProcess(1)
    }
}
